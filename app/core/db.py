"""Engines and sessions. One engine per process: the API creates its own in create_app, each
Celery worker process creates its own after the fork (app.jobs.resources)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.orm import Session, sessionmaker

from app.core.settings import Settings


def utcnow() -> datetime:
    """Naive UTC: stored the same way on Postgres (timestamp) and SQLite (text)."""
    return datetime.now(UTC).replace(tzinfo=None)


def make_engine(settings: Settings) -> Engine:
    url = settings.sqlalchemy_url
    if settings.is_sqlite:
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # a database that does not answer (a host gone, packets dropped) fails a connection attempt within this bound
    # rather than the OS's TCP timeout of minutes: requests answer 503 promptly (app.core.errors)
    engine = create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=20,
        connect_args={"connect_timeout": settings.db_connect_timeout_s},
    )
    ping_when_idle(engine, PING_AFTER_IDLE_S)
    return engine


PING_AFTER_IDLE_S = 5.0


def ping_when_idle(engine: Engine, after_s: float) -> None:
    """Pessimistic disconnect handling for connections that sat in the pool: ping one idle for more than
    `after_s` at checkout (a dead one is replaced before use). A connection returned moments ago is not
    pinged: on a busy API (the leaderboard's GET) the ping was half of each request's database round trips."""

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, record, _proxy) -> None:  # type: ignore[no-untyped-def]
        returned = record.info.get("returned_at")
        if returned is None or time.monotonic() - returned <= after_s:
            return  # new, or used moments ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as err:
            raise exc.DisconnectionError(f"pooled connection is dead: {err}") from err


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
