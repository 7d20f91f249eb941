"""The dashboard's pages. Server-rendered (Jinja2); the only JavaScript is plotly.js from the `plotly` package and
app/dashboard/static/dashboard.js (draws the plots, sorts, filters and pages the tables in place, keeps relative
times and the live progress view current). Every page works without it: sorting, filters, search and pages are
links and a GET form (app/dashboard/listing.py answers them on the server). No page carries inline script
(app/core/security_headers.py); a submission's page shows its private details only to the key that submitted it and
to admins (app/dashboard/redact.py); the live progress view is a public summary (app/submissions/disclosure.py).

Errors on the dashboard's pages (404, 403, 422, 500, 503) are pages in the site's layout; so is a 404 for an address
no route serves, for a browser (an `Accept` with text/html) and outside /v1. The API under /v1 keeps its JSON
errors (app/core/errors.py)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import plotly
from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, get_route_path
from starlette.types import Scope

from app.api.deps import ServicesDep
from app.auth.principal import Principal
from app.core.db import utcnow
from app.core.errors import RETRY_AFTER_S, error_response, unreachable
from app.dashboard import listing, queries
from app.dashboard.access import GateDep, ViewerDep, locked, log_out, open_with_key, viewer
from app.dashboard.redact import Shown, for_viewer

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
# the only files served under /static: nothing is looked up by a path the request names
STATIC = {
    "plotly.min.js": (Path(plotly.__file__).parent / "package_data" / "plotly.min.js", "text/javascript"),
    "dashboard.js": (HERE / "static" / "dashboard.js", "text/javascript"),
    "dashboard.css": (HERE / "static" / "dashboard.css", "text/css"),
    "favicon.svg": (HERE / "static" / "favicon.svg", "image/svg+xml"),
}

# plotly.js inserts a <style> of its own as it loads (its map traces' CSS), unless an element with that id exists: the
# pages with plots create each one, empty and with the CSP nonce, so the policy has nothing to refuse (no map is drawn)
_LOAD_TIME_STYLE = re.compile(
    r'document\.getElementById\("([A-Za-z0-9_.-]+)"\)\)\{var \w+=document\.createElement\("style"\)'
)
templates.env.globals["plotly_load_time_styles"] = tuple(
    dict.fromkeys(_LOAD_TIME_STYLE.findall(STATIC["plotly.min.js"][0].read_text(errors="replace")))
)


# ---------------------------------------------------------------- what the templates format


def ago(when: datetime | None, now: datetime | None = None) -> str:
    """'just now', '42 s ago', '3 min ago', '5 h ago', '2 d ago'; a date after a month."""
    if when is None:
        return "—"
    s = ((now or utcnow()) - when).total_seconds()
    if s < 5:
        return "just now"
    if s < 60:
        return f"{int(s)} s ago"
    if s < 3600:
        return f"{int(s // 60)} min ago"
    if s < 86400:
        return f"{int(s // 3600)} h ago"
    if s < 30 * 86400:
        return f"{int(s // 86400)} d ago"
    return when.strftime("%Y-%m-%d")


def duration(seconds: float | None) -> str:
    """'42 s', '3 min 07 s', '1 h 05 min'."""
    if seconds is None:
        return "—"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def qs(*parts: Mapping[str, Any], **change: Any) -> str:
    """An address' query ('?a=1&b=2') from the parameters in `parts`, with `change` applied (None drops one)."""
    merged: dict[str, Any] = {}
    for p in parts:
        merged.update(p)
    merged.update(change)
    kept = {k: v for k, v in merged.items() if v is not None and v != ""}
    return "?" + urlencode(kept) if kept else "?"


templates.env.filters["ago"] = ago
templates.env.filters["duration"] = duration
templates.env.globals["qs"] = qs
templates.env.globals["utcnow"] = utcnow


# ---------------------------------------------------------------- error pages

TITLES = {
    400: "Bad request",
    401: "Key needed",
    403: "Not allowed",
    404: "Not found",
    405: "Method not allowed",
    422: "Not a valid request",
    500: "Something went wrong",
    503: "Temporarily unavailable",
}
MESSAGES = {
    403: "This page is not yours to see.",
    404: "There is nothing at this address.",
    422: "The address asks for something this page does not understand (a filter, sort or page it does not have).",
    500: "The dashboard failed to build this page. The error is in the server's log; trying again may help.",
    503: "The dashboard cannot reach its database right now. Try again in a few seconds.",
}


async def _error_viewer(request: Request, status: int) -> Principal | None:
    """Who is looking, for the page's header; nobody when the error is the database's (it cannot be asked)."""
    if status >= 500:
        return None
    try:
        return await viewer(request, request.app.state.services)
    except Exception:  # noqa: BLE001 - the error page must render whatever the cookie or the database does
        return None


async def error_page(
    request: Request, status: int, detail: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    who = await _error_viewer(request, status)
    context = {
        "status": status,
        "title": TITLES.get(status, "Error"),
        "message": MESSAGES.get(status, ""),
        "detail": detail if status < 500 else None,
        "path": request.url.path,
        "viewer": who,
    }
    return templates.TemplateResponse(
        request, "error.html", context, status_code=status, headers={"Cache-Control": "no-store", **(headers or {})}
    )


class DashboardRoute(APIRoute):
    """A dashboard route: whatever goes wrong answers as a page in the site's layout, not as the API's JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page_or_error_page(request: Request) -> Response:
            try:
                return await handler(request)
            except StarletteHTTPException as err:
                detail = err.detail if isinstance(err.detail, str) else None
                return await error_page(request, err.status_code, detail, getattr(err, "headers", None))
            except RequestValidationError as err:
                fields = ", ".join(str(e.get("loc", ("",))[-1]) for e in err.errors()[:5])
                return await error_page(request, 422, f"not understood: {fields}" if fields else None)
            except Exception as err:  # a page, not a traceback, and the traceback in the log
                down = unreachable(err)
                if down is not None:
                    log.warning(
                        "%s %s: the %s is unreachable: %s", request.method, request.url.path, down, type(err).__name__
                    )
                    return await error_page(request, 503, headers={"Retry-After": str(RETRY_AFTER_S)})
                log.exception("%s %s failed", request.method, request.url.path)
                return await error_page(request, 500)

        return page_or_error_page


_PROBING = "kaudit.dashboard.probing"
_API_PREFIXES = ("/v1/", "/openapi.json", "/docs", "/redoc")


class UnknownAddress(DashboardRoute):
    """Takes a request only when no other route of the app would (fully, or for another method): an address nobody
    serves. Never one under /v1 (the API's unknown addresses stay the API's JSON 404)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get("type") != "http" or scope.get(_PROBING):
            return Match.NONE, {}
        path = get_route_path(scope)
        if path == "/v1" or path.startswith(_API_PREFIXES):
            return Match.NONE, {}
        app = scope.get("app")
        if app is not None:
            # the address itself, and with its trailing slash toggled (the router redirects to that one)
            variants = (
                [scope]
                if path == "/"
                else [scope, {**scope, "path": scope["path"][:-1] if path.endswith("/") else scope["path"] + "/"}]
            )
            scope[_PROBING] = True
            try:
                for probe in variants:
                    probe[_PROBING] = True
                    if any(r.matches(probe)[0] is not Match.NONE for r in app.router.routes):
                        return Match.NONE, {}
            finally:
                scope.pop(_PROBING, None)
        return super().matches(scope)


router = APIRouter(include_in_schema=False, route_class=DashboardRoute)


# ---------------------------------------------------------------- files


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    found = STATIC.get(name)
    if found is None:
        raise HTTPException(404, f"no static file '{name}'")
    return FileResponse(found[0], media_type=found[1], headers={"Cache-Control": "public, max-age=3600"})


@router.get("/favicon.ico")
def favicon() -> FileResponse:
    path, media = STATIC["favicon.svg"]
    return FileResponse(path, media_type=media, headers={"Cache-Control": "public, max-age=86400"})


def _page(
    request: Request, name: str, who: Principal | None, context: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    return templates.TemplateResponse(request, name, {**context, "viewer": who}, headers=headers)


# ---------------------------------------------------------------- logging in and out


@router.get("/login", response_class=HTMLResponse)
def login_page(next: Annotated[str, Query(max_length=2000)] = "/") -> Response:
    return locked("Log in with your API key to see your own submissions' details.", next, status_code=200)


@router.post("/key")
async def key_form(
    request: Request,
    services: ServicesDep,
    key: Annotated[str, Form(max_length=200)],
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    return await open_with_key(request, services, key, next)


@router.post("/logout")
def logout(request: Request) -> Response:
    return log_out(request)


# ---------------------------------------------------------------- pages

ListingQuery = Annotated[listing.Listing, Query()]


@router.get("/", response_class=HTMLResponse)
def problems_page(request: Request, services: ServicesDep, gate: GateDep, who: ViewerDep) -> Response:
    if gate is not None:
        return gate
    with services.sessions() as session:
        rows = queries.problems(session)
        live = listing.live_audits(session)
    return _page(request, "problems.html", who, {"problems": rows, "live": live, "live_problem": None})


@router.get("/problems/{problem}", response_class=HTMLResponse)
def leaderboard_page(
    request: Request,
    problem: str,
    services: ServicesDep,
    gate: GateDep,
    who: ViewerDep,
    want: ListingQuery,
    show: queries.RowFilter = queries.RowFilter.all,
) -> Response:
    if gate is not None:
        return gate
    with services.sessions() as session:
        if problem not in services.problems.get(session):
            raise HTTPException(404, f"unknown problem '{problem[:200]}'")
        page = listing.board_page(session, problem, show, want)
        live = listing.live_audits(session, problem)
        history = listing.history_figure(session, problem)
    return _page(
        request,
        "leaderboard.html",
        who,
        {
            "problem": problem,
            "page": page,
            "want": want,
            "show": show,
            "filters": list(queries.RowFilter),
            "stages": queries.board_stages(page.rows),
            "live": live,
            "live_problem": problem,
            "history": history,
        },
    )


@router.get("/submissions", response_class=HTMLResponse)
def submissions_list(
    request: Request,
    services: ServicesDep,
    gate: GateDep,
    who: ViewerDep,
    want: ListingQuery,
    problem: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    if gate is not None:
        return gate
    with services.sessions() as session:
        if problem and problem not in services.problems.get(session):
            raise HTTPException(404, f"unknown problem '{problem[:200]}'")
        page = listing.submissions_page(session, want, problem or None)
        live = listing.live_audits(session, problem or None)
    return _page(
        request,
        "submissions.html",
        who,
        {"page": page, "want": want, "problem": problem or None, "live": live, "live_problem": problem or None},
    )


@router.get("/live", response_class=HTMLResponse)
def live_fragment(
    request: Request,
    services: ServicesDep,
    gate: GateDep,
    who: ViewerDep,
    problem: Annotated[str | None, Query(max_length=200)] = None,
    track: Annotated[str, Query(max_length=2000)] = "",
) -> Response:
    """The live progress view alone (the audits queued or running, and the tracked ones that finished since), for
    dashboard.js to swap in every few seconds. Public summary only: statuses, stages, times, queue positions."""
    if gate is not None:
        return gate
    with services.sessions() as session:
        live = listing.live_audits(session, problem or None, listing.tracked_ids(track))
    active = sum(1 for a in live if not a.finished)
    return _page(
        request,
        "_live.html",
        who,
        {"live": live, "live_problem": problem or None},
        headers={"Cache-Control": "no-store", "X-Live-Active": str(active)},
    )


def _submission(
    services: ServicesDep, submission_id: str, who: Principal | None
) -> tuple[Shown, listing.LiveAudit | None]:
    with services.sessions() as session:
        view = queries.submission(session, submission_id)
        if view is None:
            raise HTTPException(404, f"unknown submission '{submission_id[:64]}'")
        return for_viewer(session, view, who), listing.audit_progress(session, submission_id)


@router.get("/submissions/{submission_id}", response_class=HTMLResponse)
def submission_page(
    request: Request, submission_id: str, services: ServicesDep, gate: GateDep, who: ViewerDep
) -> Response:
    if gate is not None:
        return gate
    shown, progress = _submission(services, submission_id, who)
    # a page with a submission's private details is for this browser only
    headers = None if shown.private_hidden else {"Cache-Control": "private, no-store"}
    return _page(
        request,
        "submission.html",
        who,
        {"s": shown.view, "private_hidden": shown.private_hidden, "progress": progress},
        headers,
    )


@router.get("/submissions/{submission_id}/live", response_class=HTMLResponse)
def submission_fragment(
    request: Request, submission_id: str, services: ServicesDep, gate: GateDep, who: ViewerDep
) -> Response:
    """The audit part of the submission page, for dashboard.js to swap in while the audit runs."""
    if gate is not None:
        return gate
    shown, progress = _submission(services, submission_id, who)
    return _page(
        request,
        "_audit.html",
        who,
        {"s": shown.view, "private_hidden": shown.private_hidden, "progress": progress},
        headers={"Cache-Control": "no-store", "X-Audit-Status": shown.view.status},
    )


# ---------------------------------------------------------------- any other address


async def unknown_address(request: Request) -> Response:
    """A browser gets the site's 404 page; any other client the API's JSON 404."""
    if "text/html" in request.headers.get("accept", ""):
        return await error_page(request, 404)
    return error_response(404, "Not Found")


router.add_api_route(
    "/{path:path}",
    unknown_address,
    include_in_schema=False,
    name="unknown_address",
    methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
    response_class=HTMLResponse,
    route_class_override=UnknownAddress,
)
