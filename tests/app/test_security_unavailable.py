"""With the database or the broker unreachable, every route answers 503 in the one JSON error shape naming what is
down, `/healthz` says which, and `/livez` stays up. Real uvicorn over HTTP, real Postgres databases (one dropped
under the running API, one on a port nothing listens on) and a broker URL nothing answers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from svc_support import PG_ADMIN_URL, Proc, bootstrap, drop_pg_database, env_for, example, free_port, wait_for

from app.core.settings import Settings
from app.main import create_app

pytestmark = pytest.mark.services
NOTHING_LISTENS = 1  # tcpmux: nothing listens on port 1 here, so connecting is refused at once


def _live(url: str) -> bool:
    try:
        return httpx.get(url + "/livez", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def _api(settings: Settings, log: Path) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "app.main:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = Proc(argv, env_for(settings), log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _live(url), 60, "uvicorn did not start", proc)
        yield url
    finally:
        proc.stop()


def _unavailable(r: httpx.Response, *down: str) -> None:
    assert r.status_code == 503, (r.request.url, r.status_code, r.text[:300])
    assert r.headers["retry-after"].isdigit()
    if not r.request.url.path.startswith(("/v1/", "/healthz")):
        # a dashboard page: a readable HTML error page, with no internals in it
        assert r.headers["content-type"].startswith("text/html") and 'data-status="503"' in r.text, r.text[:300]
        assert "Traceback" not in r.text and "psycopg" not in r.text
        return
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"detail", "errors"} and all(d in body["detail"] for d in down), body
    assert [e["field"] for e in body["errors"]] == list(down), body


ROUTES = [
    "/",
    "/problems/embedding_backward",
    "/v1/problems",
    "/v1/leaderboard/embedding_backward",
    "/v1/submissions",
    "/v1/submissions/" + "0" * 32,
    "/v1/api-keys",
]


def test_a_dropped_database_is_503_json_everywhere_and_healthz_names_it(
    service_settings: Settings, tmp_path: Path
) -> None:
    keys = bootstrap(service_settings)
    with _api(service_settings, tmp_path / "api.log") as url:
        h = {"Authorization": f"Bearer {keys['alice']}"}
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
        drop_pg_database(service_settings.database_url)  # WITH (FORCE): the API's pooled connections die with it
        for path in ROUTES:
            _unavailable(httpx.get(url + path, headers=h, timeout=20), "database")
        _unavailable(
            httpx.post(url + "/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=20), "database"
        )
        _unavailable(httpx.get(url + "/healthz", timeout=20), "database")
        assert httpx.get(url + "/livez", timeout=5).json() == {"status": "ok"}


def test_an_unreachable_database_port_and_broker_are_named_by_healthz(
    service_settings: Settings, tmp_path: Path
) -> None:
    nowhere_db = PG_ADMIN_URL.rsplit("@", 1)[0] + f"@127.0.0.1:{NOTHING_LISTENS}/test"
    nowhere_broker = f"redis://127.0.0.1:{NOTHING_LISTENS}/0"
    both = service_settings.model_copy(update={"database_url": nowhere_db, "redis_url": nowhere_broker})
    with _api(both, tmp_path / "api.log") as url:
        _unavailable(httpx.get(url + "/healthz", timeout=20), "database", "broker")
        _unavailable(httpx.get(url + "/v1/problems", timeout=20), "database")
        assert httpx.get(url + "/livez", timeout=5).status_code == 200
    bootstrap(service_settings)
    broker_only = service_settings.model_copy(update={"redis_url": nowhere_broker})
    with TestClient(create_app(broker_only)) as c:
        r = c.get("/healthz")
        assert r.status_code == 503 and [e["field"] for e in r.json()["errors"]] == ["broker"], r.text
        assert c.get("/v1/problems").status_code == 200  # reading needs no broker


def test_an_unexpected_error_is_a_json_500_that_tells_nothing(sqlite_settings: Settings) -> None:
    app = create_app(sqlite_settings)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("/home/kaudit/secret/path")

    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/boom")
    assert r.status_code == 500 and r.json() == {"detail": "internal server error", "errors": []}
    assert "secret" not in r.text
