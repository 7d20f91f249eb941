"""Security headers on every response, and a per-request CSP nonce for the pages that need one.

The dashboard runs no inline script: its JavaScript is /static/plotly.min.js and /static/dashboard.js, and the
figures travel as `<script type="application/json">` data blocks, which a browser never executes. plotly.js writes
its own CSS rules into `<style id="plotly.js-style-global">` through the CSSOM (which CSP allows); the submission
page creates that element with the request's nonce, so plotly finds it and never has to insert an inline `<style>`
of its own. The API docs page (Swagger UI, served from this server by app/api/docs.py) starts with an inline script
that carries the nonce, and sets inline styles on its elements: the docs pages are the one relaxation of inline
styles. No page loads anything from another host."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

NONCE_KEY = "csp_nonce"

BASE_POLICY: Mapping[str, str] = {
    "default-src": "'self'",
    "script-src": "'self' 'nonce-{nonce}'",
    "style-src": "'self' 'nonce-{nonce}'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
DOCS_POLICY: Mapping[str, str] = {
    **BASE_POLICY,
    "script-src": "'self' 'nonce-{nonce}'",
    "style-src": "'self' 'unsafe-inline'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "worker-src": "'self' blob:",
}
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect"})

STATIC_HEADERS: Mapping[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def render_policy(policy: Mapping[str, str], nonce: str) -> str:
    return "; ".join(f"{name} {value.format(nonce=nonce)}" for name, value in policy.items())


def csp_nonce(scope: Scope) -> str:
    """This request's nonce (templates read it as `request.state.csp_nonce`)."""
    return str(scope.get("state", {}).get(NONCE_KEY, ""))


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})[NONCE_KEY] = nonce
        policy = render_policy(DOCS_POLICY if scope.get("path") in DOCS_PATHS else BASE_POLICY, nonce)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in STATIC_HEADERS.items():
                    headers.setdefault(name, value)
                headers.setdefault("Content-Security-Policy", policy)
            await send(message)

        await self.app(scope, receive, with_headers)
