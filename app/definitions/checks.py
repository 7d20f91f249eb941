"""What a definition must satisfy to be stored, beyond its format: an address that fits, and text the database
can hold. Answered as 422 with each field at fault, never as a database error."""

from __future__ import annotations

from collections.abc import Iterator

from app.core.errors import FieldError
from app.core.jsonsafe import unstorable_reason
from app.problems.namespaces import MAX_UPLOAD_NAME_CHARS, NAMESPACE_CHARS, SEPARATOR
from worker.formats.bundle import DefinitionBundle


def _shown(text: str) -> str:
    """`text` as an error may echo it: escaped where it cannot be stored or sent (NUL, a lone surrogate)."""
    return text if unstorable_reason(text) is None else ascii(text)[1:-1]


def _strings(value: object, path: str) -> Iterator[tuple[str, str, bool]]:
    """(field, text, is_a_key) for every string in a JSON document, keys included; fields are shown escaped."""
    if isinstance(value, str):
        yield path, value, False
    elif isinstance(value, dict):
        for k, v in value.items():
            key = str(k)
            yield path, key, True
            yield from _strings(v, f"{path}.{_shown(key)}" if path else _shown(key))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}.{i}" if path else str(i))


def storage_errors(bundle: DefinitionBundle) -> list[FieldError]:
    errors = []
    name = bundle.definition.name
    if len(name) > MAX_UPLOAD_NAME_CHARS:
        errors.append(
            FieldError(
                field="definition.name",
                reason=(
                    f"{len(name)} characters; an uploaded definition's name may have at most {MAX_UPLOAD_NAME_CHARS} (its "
                    f"address adds '{SEPARATOR}' and your {NAMESPACE_CHARS}-character namespace, up to 200): shorten it"
                ),
            )
        )
    for field, text, is_key in _strings(bundle.document(), ""):
        reason = unstorable_reason(text)
        if reason is not None:
            errors.append(
                FieldError(
                    field=field or "(body)", reason=(f"the key '{_shown(text)[:60]}' " if is_key else "") + reason
                )
            )
    return errors
