"""Where a problem lives. Catalogue problems (folders under kernels/) and uploaded ones are separate namespaces:
a catalogue problem's address is its definition's name; an upload's is `<definition name>@<namespace>`, the
namespace being its uploading API key's. Definition names cannot hold '@', so no upload can ever take a catalogue
name (nor a later catalogue problem an upload's), and two keys' uploads of one name never meet."""

from __future__ import annotations

from app.core.jsonsafe import unstorable_reason

CATALOGUE = "catalogue"
ORIGIN_CATALOGUE = "catalogue"
ORIGIN_UPLOADED = "uploaded"
SEPARATOR = "@"
NAMESPACE_CHARS = 12
MAX_ADDRESS_CHARS = 200  # problems.name
MAX_UPLOAD_NAME_CHARS = MAX_ADDRESS_CHARS - len(SEPARATOR) - NAMESPACE_CHARS


def namespace_of(key_id: str) -> str:
    """An API key's namespace: the start of its id (ids are random hex, so namespaces do not collide)."""
    return key_id[:NAMESPACE_CHARS]


def upload_address(definition_name: str, namespace: str) -> str:
    return f"{definition_name}{SEPARATOR}{namespace}"


def lookupable(name: str) -> bool:
    """Could `name` be an address at all? A longer or unstorable one names nothing (and must not reach SQL)."""
    return 0 < len(name) <= MAX_ADDRESS_CHARS and unstorable_reason(name) is None
