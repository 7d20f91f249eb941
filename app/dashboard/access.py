"""Who may read the dashboard: everyone by default (KAUDIT_DASHBOARD_PUBLIC=true, a public leaderboard); with
KAUDIT_DASHBOARD_PUBLIC=false, holders of a live API key. The key comes once, from the locked page's form (POST /key)
or as ?key=... on any page; it is moved into an HttpOnly cookie and the browser is redirected to the address without
it: no page ever contains a key."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlencode

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import escape
from starlette.concurrency import run_in_threadpool

from app.api.deps import Services, ServicesDep
from app.auth.keys import find_key, hash_key

COOKIE = "kaudit_key"
_LOCAL = re.compile(r"/[A-Za-z0-9_\-./?=&%]*")
LOCKED_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>kernel-audit: key needed</title>
<link rel="stylesheet" href="/static/dashboard.css"></head><body><main><h1>kernel-audit</h1>
<p id="locked">{message}</p><form method="post" action="/key"><input type="hidden" name="next" value="{next}">
<label>API key <input type="password" name="key" autocomplete="off"></label>
<button type="submit">Open</button></form></main></body></html>"""


def locked(message: str, next_path: str) -> HTMLResponse:
    return HTMLResponse(LOCKED_PAGE.format(message=escape(message), next=escape(local_path(next_path))), status_code=401)


def local_path(path: str) -> str:
    """Only a path on this site (no scheme, host or '//' prefix) is a place to send the browser back to."""
    return path if _LOCAL.fullmatch(path) and not path.startswith("//") else "/"


def with_key_cookie(response: Response, key: str, https: bool) -> Response:
    response.set_cookie(COOKIE, key, httponly=True, samesite="strict", secure=https)
    return response


def _known(services: Services, plaintext: str) -> bool:
    digest = hash_key(plaintext)
    found, principal = services.key_cache.get(digest)
    if found:
        return principal is not None
    with services.sessions() as session:
        key = find_key(session, plaintext)
    return key is not None


async def gate(request: Request, services: ServicesDep) -> Response | None:
    """None: the page may be shown. Otherwise the response to send instead (a redirect that sets the cookie, or
    the page asking for a key)."""
    if services.settings.dashboard_public:
        return None
    offered = request.query_params.get("key")
    if offered:
        if not await run_in_threadpool(_known, services, offered):
            return locked("That API key is unknown or revoked.", request.url.path)
        rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "key"])
        return with_key_cookie(RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303), offered,
                               request.url.scheme == "https")
    held = request.cookies.get(COOKIE)
    if held and await run_in_threadpool(_known, services, held):
        return None
    return locked("This dashboard needs an API key.", request.url.path)


async def open_with_key(request: Request, services: Services, key: str, next_path: str) -> Response:
    """The locked page's form (POST, so the key stays out of addresses and access logs)."""
    if not await run_in_threadpool(_known, services, key):
        return locked("That API key is unknown or revoked.", next_path)
    return with_key_cookie(RedirectResponse(local_path(next_path), status_code=303), key, request.url.scheme == "https")


GateDep = Annotated[Response | None, Depends(gate)]
