"""The dashboard's pages. Server-rendered (Jinja2); the only JavaScript is plotly.js from the `plotly` package and
app/dashboard/static/dashboard.js (draws the plots, and polls a running audit's fragment until it finishes). No page
carries inline script (app/core/security_headers.py); a submission's page shows its private details only to the
key that submitted it and to admins (app/dashboard/redact.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import plotly
from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from app.api.deps import ServicesDep
from app.dashboard import queries
from app.auth.principal import Principal
from app.dashboard.access import GateDep, ViewerDep, locked, log_out, open_with_key
from app.dashboard.redact import Shown, for_viewer
from app.leaderboard.repository import STAGES

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
# the only files served under /static: nothing is looked up by a path the request names
STATIC = {
    "plotly.min.js": (Path(plotly.__file__).parent / "package_data" / "plotly.min.js", "text/javascript"),
    "dashboard.js": (HERE / "static" / "dashboard.js", "text/javascript"),
    "dashboard.css": (HERE / "static" / "dashboard.css", "text/css"),
}

# plotly.js inserts a <style> of its own as it loads (its map traces' CSS), unless an element with that id exists: the
# submission page creates each one, empty and with the CSP nonce, so the policy has nothing to refuse (no map is drawn)
_LOAD_TIME_STYLE = re.compile(r'document\.getElementById\("([A-Za-z0-9_.-]+)"\)\)\{var \w+=document\.createElement\("style"\)')
templates.env.globals["plotly_load_time_styles"] = tuple(
    dict.fromkeys(_LOAD_TIME_STYLE.findall(STATIC["plotly.min.js"][0].read_text(errors="replace"))))

router = APIRouter(include_in_schema=False)


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    found = STATIC.get(name)
    if found is None:
        raise HTTPException(404, f"no static file '{name}'")
    return FileResponse(found[0], media_type=found[1], headers={"Cache-Control": "public, max-age=3600"})


def _page(request: Request, name: str, who: Principal | None, context: dict[str, Any],
          headers: dict[str, str] | None = None) -> Response:
    return templates.TemplateResponse(request, name, {**context, "viewer": who}, headers=headers)


@router.get("/login", response_class=HTMLResponse)
def login_page(next: Annotated[str, Query(max_length=2000)] = "/") -> Response:
    return locked("Log in with your API key to see your own submissions' details.", next, status_code=200)


@router.post("/key")
async def key_form(request: Request, services: ServicesDep, key: Annotated[str, Form(max_length=200)],
                   next: Annotated[str, Form(max_length=2000)] = "/") -> Response:
    return await open_with_key(request, services, key, next)


@router.post("/logout")
def logout(request: Request) -> Response:
    return log_out(request)


@router.get("/", response_class=HTMLResponse)
def problems_page(request: Request, services: ServicesDep, gate: GateDep, who: ViewerDep) -> Response:
    if gate is not None:
        return gate
    with services.sessions() as session:
        rows = queries.problems(session)
    return _page(request, "problems.html", who, {"problems": rows})


@router.get("/problems/{problem}", response_class=HTMLResponse)
def leaderboard_page(request: Request, problem: str, services: ServicesDep, gate: GateDep, who: ViewerDep,
                     show: queries.RowFilter = queries.RowFilter.all) -> Response:
    if gate is not None:
        return gate
    with services.sessions() as session:
        if problem not in services.problems.get(session):
            raise HTTPException(404, f"unknown problem '{problem}'")
        rows = queries.board(session, problem, show)
        running = queries.in_progress(session, problem)
    return _page(request, "leaderboard.html", who, {
        "problem": problem, "rows": rows, "running": running, "show": show, "filters": list(queries.RowFilter),
        "stages": STAGES})


def _submission(services: ServicesDep, submission_id: str, who: Principal | None) -> Shown:
    with services.sessions() as session:
        view = queries.submission(session, submission_id)
        if view is None:
            raise HTTPException(404, f"unknown submission '{submission_id[:64]}'")
        return for_viewer(session, view, who)


@router.get("/submissions/{submission_id}", response_class=HTMLResponse)
def submission_page(request: Request, submission_id: str, services: ServicesDep, gate: GateDep, who: ViewerDep) -> Response:
    if gate is not None:
        return gate
    shown = _submission(services, submission_id, who)
    # a page with a submission's private details is for this browser only
    headers = None if shown.private_hidden else {"Cache-Control": "private, no-store"}
    return _page(request, "submission.html", who, {"s": shown.view, "private_hidden": shown.private_hidden}, headers)


@router.get("/submissions/{submission_id}/live", response_class=HTMLResponse)
def submission_fragment(request: Request, submission_id: str, services: ServicesDep, gate: GateDep, who: ViewerDep) -> Response:
    """The audit part of the submission page, for dashboard.js to swap in while the audit runs."""
    if gate is not None:
        return gate
    shown = _submission(services, submission_id, who)
    return _page(request, "_audit.html", who, {"s": shown.view, "private_hidden": shown.private_hidden},
                 headers={"Cache-Control": "no-store", "X-Audit-Status": shown.view.status})
