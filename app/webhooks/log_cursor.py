"""The opaque pagination cursor of an endpoint's delivery log: the (started_at, row id) of the last attempt shown,
made like GET /v1/submissions' (app.submissions.cursor), so a client pages both the same way."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from app.submissions.cursor import BadCursor

__all__ = ["BadCursor", "decode", "encode"]
_MESSAGE = "not a cursor this API gave out; pass next_cursor from the previous page"


def encode(started_at: datetime, attempt_row_id: int) -> str:
    return base64.urlsafe_b64encode(f"{started_at.isoformat()}|{attempt_row_id}".encode()).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, row_id = raw.partition("|")
        when = datetime.fromisoformat(at)
        number = int(row_id) if row_id.isdigit() and len(row_id) <= 19 else -1
    except (binascii.Error, UnicodeDecodeError, ValueError) as err:
        raise BadCursor(_MESSAGE) from err
    if number < 0 or when.tzinfo is not None:
        raise BadCursor(_MESSAGE)
    return when, number
