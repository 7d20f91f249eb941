"""Query strings carrying a NUL character are refused before any route sees them: Postgres text cannot hold NUL,
so a query value like `%00` reaching SQL is a server error (found by the schema fuzzer on
`GET /v1/submissions?problem=%00`). One guard covers every route's query parameters, present and future; a NUL in
a path segment names nothing, and each lookup route already answers it 404."""

from __future__ import annotations

import json
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.errors import FieldError, error_body


def _has_nul(scope: Scope) -> bool:
    return b"\x00" in unquote_to_bytes(scope.get("query_string", b""))


class RejectNulMiddleware:
    """422 with the usual error body for a NUL (`%00`) in the decoded query string."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_nul(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_body("the query string contains a NUL character (%00)",
                                     [FieldError(field="(query)", reason="NUL characters are not allowed in query parameters")])).encode()
        await send({"type": "http.response.start", "status": 422,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
