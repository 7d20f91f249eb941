"""A format error names the file, the field and what was expected."""

from __future__ import annotations

import re

from pydantic import ValidationError


class FormatError(ValueError):
    """An input file that does not follow the SOL-ExecBench format."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def plain_reason(msg: str) -> str:
    """pydantic's message without the 'Value error, ' prefix it adds to a validator's own words."""
    for prefix in _PYDANTIC_PREFIXES:
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


_FIELD_PATH = re.compile(r"[A-Za-z_][\w.]*")


def describe_validation_error(err: ValidationError) -> list[str]:
    """Turn pydantic's errors into 'field.path: what was expected' lines.

    A model validator that names a field deeper than where it runs ("spec.languages: ..." raised on `spec`) is
    reported at that field, so the API's error names it too."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        reason = plain_reason(e["msg"])
        head, sep, _ = reason.partition(": ")
        if sep and loc != "(root)" and head.startswith(loc + ".") and _FIELD_PATH.fullmatch(head):
            lines.append(reason)
        else:
            lines.append(f"{loc}: {reason}")
    return lines
