"""Who may read the dashboard: everyone by default (KAUDIT_DASHBOARD_PUBLIC=true, a public leaderboard); with
KAUDIT_DASHBOARD_PUBLIC=false, holders of a live API key. The key comes once as ?key=..., is moved into an HttpOnly
cookie, and the browser is redirected to the same address without it: no page ever contains a key."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import Services, ServicesDep
from app.auth.keys import find_key, hash_key

COOKIE = "kaudit_key"
LOCKED_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>kernel-audit: key needed</title>
<link rel="stylesheet" href="/static/dashboard.css"></head><body><main><h1>kernel-audit</h1>
<p id="locked">{message}</p><form method="get"><label>API key <input type="password" name="key" autocomplete="off"></label>
<button type="submit">Open</button></form></main></body></html>"""


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
            return HTMLResponse(LOCKED_PAGE.format(message="That API key is unknown or revoked."), status_code=401)
        rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "key"])
        resp = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
        resp.set_cookie(COOKIE, offered, httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return resp
    held = request.cookies.get(COOKIE)
    if held and await run_in_threadpool(_known, services, held):
        return None
    return HTMLResponse(LOCKED_PAGE.format(message="This dashboard needs an API key."), status_code=401)


GateDep = Annotated[Response | None, Depends(gate)]
