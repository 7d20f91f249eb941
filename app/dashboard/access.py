"""Who is looking at the dashboard, and whether they may.

The viewer is the API key in the dashboard's cookie, set only by the login form (POST /key): an HttpOnly,
SameSite=Strict cookie, so no page, script or address ever holds the key. A key in the query string (`?key=...`)
authenticates nothing: addresses end up in access logs, browser history and Referer headers.

Pages: everyone by default (KAUDIT_DASHBOARD_PUBLIC=true, a public leaderboard); with KAUDIT_DASHBOARD_PUBLIC=false,
holders of a live API key. What a page shows of a submission is decided by app/submissions/disclosure.py, as in
the API: its private details only to the key that submitted it and to admins."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import escape

from app.api.deps import Services, ServicesDep
from app.auth.dependencies import principal_for
from app.auth.principal import Principal

COOKIE = "kaudit_key"
_LOCAL = re.compile(r"/[A-Za-z0-9_\-./?=&%]*")
LOCKED_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>kernel-audit: key needed</title>
<link rel="stylesheet" href="/static/dashboard.css"></head><body><main><h1>kernel-audit</h1>
<p id="locked">{message}</p><form method="post" action="/key"><input type="hidden" name="next" value="{next}">
<label>API key <input type="password" name="key" autocomplete="off"></label>
<button type="submit">Open</button></form></main></body></html>"""


def locked(message: str, next_path: str, status_code: int = 401) -> HTMLResponse:
    return HTMLResponse(
        LOCKED_PAGE.format(message=escape(message), next=escape(local_path(next_path))), status_code=status_code
    )


def local_path(path: str) -> str:
    """Only a path on this site (no scheme, host or '//' prefix) is a place to send the browser back to."""
    return path if _LOCAL.fullmatch(path) and not path.startswith("//") else "/"


def same_site_form(request: Request) -> bool:
    """The form was posted from this site's own page: a cross-site form must not log a browser in (or out) with
    someone else's key. Browsers send Origin (and Sec-Fetch-Site) on every form POST."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host", "")


def with_key_cookie(response: Response, key: str, https: bool) -> Response:
    response.set_cookie(COOKIE, key, httponly=True, samesite="strict", secure=https, path="/")
    return response


async def viewer(request: Request, services: ServicesDep) -> Principal | None:
    """The principal of the cookie's key; None without one, or when it is unknown or revoked."""
    held = request.cookies.get(COOKIE)
    return await principal_for(services, held) if held else None


ViewerDep = Annotated[Principal | None, Depends(viewer)]


async def gate(request: Request, services: ServicesDep, who: ViewerDep) -> Response | None:
    """None: the page may be shown. Otherwise the page asking for a key, to send instead."""
    if services.settings.dashboard_public or who is not None:
        return None
    return locked("This dashboard needs an API key.", request.url.path)


async def open_with_key(request: Request, services: Services, key: str, next_path: str) -> Response:
    """The login form (POST, so the key stays out of addresses and access logs)."""
    if not same_site_form(request):
        return locked("Log in from this site's own form.", next_path, status_code=403)
    if await principal_for(services, key) is None:
        return locked("That API key is unknown or revoked.", next_path)
    return with_key_cookie(RedirectResponse(local_path(next_path), status_code=303), key, request.url.scheme == "https")


def log_out(request: Request) -> Response:
    if not same_site_form(request):
        return locked("Log out from this site's own pages.", "/", status_code=403)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


GateDep = Annotated[Response | None, Depends(gate)]
