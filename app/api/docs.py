"""The API docs page (Swagger UI), served from this server alone: its script and stylesheet come from the pinned
swagger-ui-py package (a dashboard behind a firewall still has its docs), and its inline script carries the request's
CSP nonce, without which the Content-Security-Policy (app/core/security_headers.py) runs no inline script. ReDoc needs a
CDN, so /redoc sends people to /docs."""

from __future__ import annotations

from pathlib import Path

import swagger_ui
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from app.core.security_headers import csp_nonce

OAUTH2_REDIRECT = "/docs/oauth2-redirect"
ASSETS = "/docs/assets"


def _with_nonce(page: HTMLResponse, nonce: str) -> HTMLResponse:
    """Only the inline `<script>` tags (those with a src are allowed by their origin) get the nonce."""
    html = bytes(page.body).decode().replace("<script>", f'<script nonce="{nonce}">')
    return HTMLResponse(html, status_code=page.status_code)


def install_docs(app: FastAPI) -> None:
    """For an app built with docs_url=None and redoc_url=None: the same pages at the same paths."""
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS, StaticFiles(directory=Path(swagger_ui.__file__).parent / "static"), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger(request: Request) -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=OAUTH2_REDIRECT,
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url="/favicon.ico",
        )
        return _with_nonce(page, csp_nonce(request.scope))

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    def oauth2_redirect(request: Request) -> HTMLResponse:
        return _with_nonce(get_swagger_ui_oauth2_redirect_html(), csp_nonce(request.scope))

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> RedirectResponse:
        return RedirectResponse("/docs", status_code=308)
