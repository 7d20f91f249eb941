"""Make what a submission can put in a stage result storable on Postgres and SQLite.

Postgres text cannot hold NUL, UTF-8 cannot encode a lone surrogate (JSON's "\\ud800" decodes to one), and its JSON
holds no NaN/Inf tokens or numpy scalars. Exception text, a kernel's stdout, file names and evidence keys are the
kernel's to choose, so every string (dict keys included) is cleaned on the way in, recursively: otherwise a kernel
could make storing its own failure fail, and turn its verdict into an error."""

from __future__ import annotations

import math
import re
from typing import Any

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """`text` with each NUL and each lone surrogate replaced by U+FFFD; unchanged (and not copied) when clean."""
    if "\x00" not in text:
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    return _UNSTORABLE.sub(REPLACEMENT, text)


def unstorable_reason(text: str) -> str | None:
    """Why `text` cannot be stored as it is (None: it can), in words a person can act on."""
    if "\x00" in text:
        return "contains a NUL character (U+0000), which cannot be stored; remove it"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text; remove it"
    return None


def jsonable(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {storable_text(str(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return jsonable(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"))
    return storable_text(str(value))
