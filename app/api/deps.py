"""Typed FastAPI dependencies: routers ask for what they need by type, never read `request.app.state` themselves.

`UnitOfWorkDep` is the request's one session and one transaction: it commits when the route function returns
(before the response is sent) and only then sends the audits the route enqueued."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from app.audits.queue import AuditQueue
from app.auth.keycache import KeyCache
from app.auth.ratelimit import RateLimiter
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.problems.index import ProblemIndex


@dataclass(frozen=True)
class Services:
    """Everything the app holds, built once by `app.main.create_app` from Settings."""

    settings: Settings
    sessions: sessionmaker[Session]
    queue: AuditQueue
    limiter: RateLimiter
    problems: ProblemIndex
    key_cache: KeyCache


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_settings(services: ServicesDep) -> Settings:
    return services.settings


def get_unit_of_work(services: ServicesDep) -> Iterator[UnitOfWork]:
    with UnitOfWork(services.sessions, services.queue) as uow:
        yield uow


def get_session(uow: Annotated[UnitOfWork, Depends(get_unit_of_work, scope="function")]) -> Session:
    return uow.session


SettingsDep = Annotated[Settings, Depends(get_settings)]
UnitOfWorkDep = Annotated[UnitOfWork, Depends(get_unit_of_work, scope="function")]
SessionDep = Annotated[Session, Depends(get_session)]
