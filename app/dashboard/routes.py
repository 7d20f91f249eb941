"""The dashboard's pages. Server-rendered (Jinja2); the only JavaScript is plotly.js from the `plotly` package and
app/dashboard/static/dashboard.js (draws the plots, and polls a running audit's fragment until it finishes)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import plotly
from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from app.api.deps import ServicesDep
from app.dashboard import queries
from app.dashboard.access import GateDep, open_with_key
from app.leaderboard.repository import STAGES

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
# the only files served under /static: nothing is looked up by a path the request names
STATIC = {
    "plotly.min.js": (Path(plotly.__file__).parent / "package_data" / "plotly.min.js", "text/javascript"),
    "dashboard.js": (HERE / "static" / "dashboard.js", "text/javascript"),
    "dashboard.css": (HERE / "static" / "dashboard.css", "text/css"),
}

router = APIRouter(include_in_schema=False)


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    found = STATIC.get(name)
    if found is None:
        raise HTTPException(404, f"no static file '{name}'")
    return FileResponse(found[0], media_type=found[1], headers={"Cache-Control": "public, max-age=3600"})


@router.post("/key")
async def key_form(request: Request, services: ServicesDep, key: Annotated[str, Form(max_length=200)],
                   next: Annotated[str, Form(max_length=2000)] = "/") -> Response:
    return await open_with_key(request, services, key, next)


@router.get("/", response_class=HTMLResponse)
def problems_page(request: Request, services: ServicesDep, gate: GateDep) -> Response:
    if gate is not None:
        return gate
    with services.sessions() as session:
        rows = queries.problems(session)
    return templates.TemplateResponse(request, "problems.html", {"problems": rows})


@router.get("/problems/{problem}", response_class=HTMLResponse)
def leaderboard_page(request: Request, problem: str, services: ServicesDep, gate: GateDep,
                     show: queries.RowFilter = queries.RowFilter.all) -> Response:
    if gate is not None:
        return gate
    with services.sessions() as session:
        if problem not in services.problems.get(session):
            raise HTTPException(404, f"unknown problem '{problem}'")
        rows = queries.board(session, problem, show)
        running = queries.in_progress(session, problem)
    return templates.TemplateResponse(request, "leaderboard.html", {
        "problem": problem, "rows": rows, "running": running, "show": show, "filters": list(queries.RowFilter),
        "stages": STAGES})


def _submission(services: ServicesDep, submission_id: str) -> queries.SubmissionView:
    with services.sessions() as session:
        view = queries.submission(session, submission_id)
    if view is None:
        raise HTTPException(404, f"unknown submission '{submission_id}'")
    return view


@router.get("/submissions/{submission_id}", response_class=HTMLResponse)
def submission_page(request: Request, submission_id: str, services: ServicesDep, gate: GateDep) -> Response:
    if gate is not None:
        return gate
    return templates.TemplateResponse(request, "submission.html", {"s": _submission(services, submission_id)})


@router.get("/submissions/{submission_id}/live", response_class=HTMLResponse)
def submission_fragment(request: Request, submission_id: str, services: ServicesDep, gate: GateDep) -> Response:
    """The audit part of the submission page, for dashboard.js to swap in while the audit runs."""
    if gate is not None:
        return gate
    view = _submission(services, submission_id)
    return templates.TemplateResponse(request, "_audit.html", {"s": view},
                                      headers={"Cache-Control": "no-store", "X-Audit-Status": view.status})
