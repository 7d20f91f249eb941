"""FastAPI's API docs pages (Swagger UI, ReDoc), served with the request's CSP nonce on their inline script: the
Content-Security-Policy (app/core/security_headers.py) runs no inline script without it."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

from app.core.security_headers import csp_nonce

OAUTH2_REDIRECT = "/docs/oauth2-redirect"


def _with_nonce(page: HTMLResponse, nonce: str) -> HTMLResponse:
    """Only the inline `<script>` tags (those with a src are allowed by their origin) get the nonce."""
    html = bytes(page.body).decode().replace("<script>", f'<script nonce="{nonce}">')
    return HTMLResponse(html, status_code=page.status_code)


def install_docs(app: FastAPI) -> None:
    """For an app built with docs_url=None and redoc_url=None: the same pages at the same paths."""
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger(request: Request) -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url=openapi_url, title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=OAUTH2_REDIRECT)
        return _with_nonce(page, csp_nonce(request.scope))

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    def oauth2_redirect(request: Request) -> HTMLResponse:
        return _with_nonce(get_swagger_ui_oauth2_redirect_html(), csp_nonce(request.scope))

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        return _with_nonce(get_redoc_html(openapi_url=openapi_url, title=f"{app.title} - ReDoc"), csp_nonce(request.scope))
