"""Bounded request bodies, before any route parses them: over the size limit is 413 (with or without a
Content-Length), and a JSON body nested deeper than MAX_JSON_DEPTH is 422 (json.loads recurses per level and
would otherwise fail with RecursionError, an HTTP 500, on every route that takes JSON)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import BODY, FieldError, error_body
from worker.formats.json_bounds import MAX_JSON_DEPTH, depth_over


class BodyTooLarge(Exception):
    pass


def _content_type(scope: Scope) -> bytes:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            return bytes(value.split(b";")[0].strip().lower())
    return b""


def _is_json(scope: Scope) -> bool:
    ctype = _content_type(scope)
    return ctype == b"application/json" or ctype.endswith(b"+json")


class BodyLimitMiddleware:
    """`limit` for every route, except JSON and multipart bodies sent to the (method, path) pairs `overrides` names
    (POST /v1/submissions takes token statistics beside the solution; the route itself holds the solution to `limit`)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        max_json_depth: int = MAX_JSON_DEPTH,
        overrides: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        self.app, self.limit, self.max_json_depth = app, limit, max_json_depth
        self.overrides = dict(overrides or {})

    async def _reject(self, send: Send, status: int, detail: str, reason: str) -> None:
        body = json.dumps(error_body(detail, [FieldError(field=BODY, reason=reason)])).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _too_large(self, send: Send, limit: int) -> None:
        await self._reject(send, 413, "request body too large", f"over the limit of {limit} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        if _is_json(scope) or _content_type(scope) == b"multipart/form-data":
            limit = self.overrides.get((scope.get("method", ""), scope.get("path", "")), self.limit)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._too_large(send, limit)
                    return
        if _is_json(scope):
            await self._json(scope, receive, send, limit)
        else:
            await self._streamed(scope, receive, send, limit)

    async def _json(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Read the whole (bounded) body, check its nesting, then hand it on unchanged."""
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                await self._too_large(send, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        depth = depth_over(body.decode("utf-8", errors="replace"), self.max_json_depth)
        if depth is not None:
            await self._reject(
                send,
                422,
                "invalid request",
                f"not valid JSON: nested {depth} levels deep; at most {self.max_json_depth} are allowed",
            )
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _streamed(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._too_large(send, limit)
