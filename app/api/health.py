"""Liveness and readiness.

`/livez`: the process is up and serving (touches nothing else: a restart cannot fix a database outage, so a
liveness probe must not fail on one). `/healthz`: the API can do its work, i.e. the database answers and the
broker takes connections; 503 in the one error shape, naming each dependency that is down."""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel
from sqlalchemy import text

from app.api.deps import Services, ServicesDep
from app.core.errors import Dependency, ErrorBody, unavailable_response

log = logging.getLogger(__name__)
router = APIRouter(tags=["meta"])


class Live(BaseModel):
    status: Literal["ok"] = "ok"


class Healthy(BaseModel):
    status: Literal["ok"] = "ok"
    database: Literal["ok"] = "ok"
    broker: Literal["ok"] = "ok"


def database_reachable(services: Services) -> bool:
    try:
        with services.sessions() as session:
            session.execute(text("SELECT 1"))
        return True
    except Exception as err:  # noqa: BLE001 - any failure to answer is "down" to a health check
        log.warning(
            "health: the database is unreachable: %s: %s",
            type(err).__name__,
            str(err).splitlines()[0] if str(err) else "",
        )
        return False


def broker_reachable(services: Services) -> bool:
    """A connection to the broker opens (Redis: and answers PING; its connect timeout bounds the wait)."""
    try:
        with services.queue.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=2)
            conn.default_channel  # noqa: B018 - opening the channel is what talks to the broker
        return True
    except Exception as err:  # noqa: BLE001
        log.warning(
            "health: the broker is unreachable: %s: %s",
            type(err).__name__,
            str(err).splitlines()[0] if str(err) else "",
        )
        return False


@router.get("/livez", response_model=Live)
async def livez() -> Live:
    return Live()


@router.get(
    "/healthz", response_model=Healthy, responses={503: {"model": ErrorBody, "description": "a dependency is down"}}
)
def healthz(services: ServicesDep) -> Healthy | Response:
    down: list[Dependency] = []
    if not database_reachable(services):
        down.append("database")
    if not broker_reachable(services):
        down.append("broker")
    return unavailable_response(down) if down else Healthy()
