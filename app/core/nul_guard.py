"""Query strings carrying a NUL character are refused before any route sees them: Postgres text cannot hold NUL,
so a query value like `%00` reaching SQL is a server error (found by the schema fuzzer on
`GET /v1/submissions?problem=%00`). One guard covers every route's query parameters, present and future; a NUL in
a path segment names nothing, and each lookup route already answers it 404."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.errors import FieldError, error_response


class RejectNulMiddleware:
    """422 with the usual error body for a NUL (`%00`) in the decoded query string."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or b"\x00" not in unquote_to_bytes(scope.get("query_string", b"")):
            await self.app(scope, receive, send)
            return
        response = error_response(
            422,
            "the query string contains a NUL character (%00)",
            [FieldError(field="(query)", reason="NUL characters are not allowed in query parameters")],
        )
        await response(scope, receive, send)
