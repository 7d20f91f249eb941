"""The opaque pagination cursor of GET /v1/submissions: the (created_at, id) of the last row shown."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime

_ID = re.compile(r"[0-9a-f]{32}")


class BadCursor(ValueError):
    pass


def encode(created_at: datetime, submission_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{submission_id}".encode()).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, sid = raw.partition("|")
        when = datetime.fromisoformat(at)
    except (binascii.Error, UnicodeDecodeError, ValueError) as err:
        raise BadCursor("not a cursor this API gave out; pass next_cursor from the previous page") from err
    if not _ID.fullmatch(sid) or when.tzinfo is not None:
        raise BadCursor("not a cursor this API gave out; pass next_cursor from the previous page")
    return when, sid
