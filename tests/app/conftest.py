from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from svc_support import (
    REDIS_URL,
    create_pg_database,
    drop_pg_database,
    drop_queue,
    postgres_reachable,
    redis_reachable,
)

from app.core.settings import Settings


@pytest.fixture(scope="session")
def _need_postgres() -> None:
    why = postgres_reachable()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def _need_redis() -> None:
    why = redis_reachable()
    if why:
        pytest.skip(why)


@pytest.fixture
def pg_url(_need_postgres: None) -> Iterator[str]:
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
def service_settings(pg_url: str, _need_redis: None, tmp_path: Path) -> Iterator[Settings]:
    """Real Postgres (a fresh database) and real Redis, with queue names no other test uses; short leases."""
    settings = Settings(
        database_url=pg_url,
        redis_url=REDIS_URL,
        queue_prefix=f"t{uuid.uuid4().hex[:8]}_",
        audit_stages="intake",
        lease_s=4,
        heartbeat_s=0.5,
        requeue_after_s=3,
        reaper_interval_s=0.5,
        max_claims=4,
        catalogue_root=None,
        broker_dir=tmp_path / "broker",
    )
    yield settings
    drop_queue(settings.audit_queue)


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    """The embedded default's storage: SQLite, no broker server (filesystem transport), memory rate limits."""
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'kaudit.db'}",
        redis_url=None,
        broker_url="filesystem://",
        broker_dir=tmp_path / "broker",
        rate_limit_storage_url="memory://",
        audit_stages="intake",
    )
