"""The FastAPI app factory: everything the app holds is built here from Settings (no module-level state)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from app.api.deps import Services
from app.api.docs import install_docs
from app.api.health import router as health_router
from app.audits.queue import AuditQueue
from app.auth.keycache import KeyCache
from app.auth.ratelimit import RateLimiter
from app.auth.readers import require_reader
from app.auth.router import router as auth_router
from app.core import access_log
from app.core.bodylimit import BodyLimitMiddleware
from app.core.nul_guard import RejectNulMiddleware
from app.core.db import make_engine, make_sessionmaker
from app.core.errors import ErrorBody, install_error_handlers
from app.core.security_headers import SecurityHeadersMiddleware
from app.core.settings import Settings
from app.dashboard.routes import router as dashboard_router
from app.definitions.router import router as definitions_router
from app.leaderboard.router import router as leaderboard_router
from app.problems.index import ProblemIndex
from app.problems.router import router as problems_router
from app.submissions.router import router as submissions_router
from app.webhooks.router import router as webhooks_router
from worker.registry import register_extra_stages


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    # the stages the workers run beyond worker/stages: the API shows them in progress and on the boards (names only:
    # the API never imports a stage)
    register_extra_stages(settings.extra_stages)
    access_log.install()  # whoever started uvicorn, its access log carries no query strings
    engine = make_engine(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(
        title="kernel-audit",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="Audits GPU kernel submissions (SOL-ExecBench formats) for what the benchmark's verifier misses.",
    )
    from app.jobs.celery import make_celery

    app.state.services = Services(
        settings=settings,
        sessions=make_sessionmaker(engine),
        queue=AuditQueue(make_celery(settings)),
        limiter=RateLimiter(settings.limits_storage, settings.rate_limit),
        problems=ProblemIndex(),
        key_cache=KeyCache(ttl_s=settings.key_cache_s),
    )
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.body_limit_bytes,
        overrides={("POST", "/v1/submissions"): settings.submission_body_limit_bytes},
    )
    app.add_middleware(RejectNulMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)  # added last: outermost, so every answer above carries the headers
    install_docs(app)  # the docs pages with the CSP nonce on their inline script
    for r in (health_router, submissions_router, definitions_router, auth_router, webhooks_router, dashboard_router):
        app.include_router(r)
    for r in (problems_router, leaderboard_router):  # public unless KAUDIT_PUBLIC_READ=false (app/auth/readers.py)
        app.include_router(r, dependencies=[Depends(require_reader)])

    install_error_handlers(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from app.submissions.token_stats import TokenStatsIn
            from worker.formats import Solution

            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            sol = Solution.model_json_schema(ref_template="#/components/schemas/{model}")
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            comps.update(sol.pop("$defs", {}))
            comps["Solution"] = sol
            errors = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(errors.pop("$defs", {}))
            comps["HTTPValidationError"] = errors  # every 4xx has the one shape (app/core/errors.py)
            comps["TokenStatsIn"] = TokenStatsIn.model_json_schema()  # the optional `token_stats` beside a solution
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
