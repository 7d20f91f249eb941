"""An API key in the query string authenticates nothing and never reaches the access log; the dashboard's login is a
POST form from this site that sets an HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from svc_support import Proc, bootstrap, env_for, free_port, wait_for

from app.core.settings import Settings
from app.dashboard.access import COOKIE
from app.main import create_app


def _live(url: str) -> bool:
    try:
        return httpx.get(url + "/livez", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def locked_settings(sqlite_settings: Settings) -> Settings:
    return sqlite_settings.model_copy(update={"dashboard_public": False})


@pytest.fixture
def uvicorn_info(locked_settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Proc, dict[str, str]]]:
    """uvicorn started as the Dockerfile starts it (its CLI, the app factory), with the access log on (info)."""
    keys = bootstrap(locked_settings)
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
        "info",
    ]
    proc = Proc(argv, env_for(locked_settings), tmp_path / "uvicorn.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _live(url), 60, "uvicorn did not start", proc)
        yield url, proc, keys
    finally:
        proc.stop()


def test_a_key_in_the_query_string_does_not_authenticate_nor_reach_the_access_log(uvicorn_info) -> None:  # type: ignore[no-untyped-def]
    url, proc, keys = uvicorn_info
    secret = keys["admin"]
    with httpx.Client(base_url=url, follow_redirects=False, timeout=10) as http:
        for path in ("/", "/problems/embedding_backward", "/submissions/" + "0" * 32):
            r = http.get(path, params={"key": secret, "show": "all"})
            assert r.status_code == 401 and "needs an API key" in r.text, (path, r.status_code)
            assert "set-cookie" not in r.headers and COOKIE not in http.cookies
        for name in ("key", "api_key"):
            assert http.get("/v1/api-keys", params={name: secret}).status_code == 401
        last = http.get("/v1/submissions", params={"key": secret})
        assert last.status_code == 401
    # the access log is written as each answer goes out: wait for the last request's line
    wait_for(
        lambda: '"GET /v1/submissions HTTP/1.1" 401' in proc.tail(100_000),
        20,
        "no access line for the last request",
        proc,
    )
    log = proc.log.read_text()
    assert '"GET /problems/embedding_backward HTTP/1.1" 401' in log  # the path is kept: it is what the log is for
    assert secret not in log and secret[:10] not in log and "key=" not in log, log[-2000:]


def test_the_login_form_sets_a_strict_httponly_cookie_and_refuses_other_sites(locked_settings: Settings) -> None:
    keys = bootstrap(locked_settings)
    with TestClient(create_app(locked_settings), base_url="http://dash.test") as c:
        assert c.get("/login").status_code == 200
        cross = c.post(
            "/key",
            data={"key": keys["alice"], "next": "/"},
            follow_redirects=False,
            headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        )
        assert cross.status_code == 403 and "set-cookie" not in cross.headers
        r = c.post(
            "/key",
            data={"key": keys["alice"], "next": "/"},
            follow_redirects=False,
            headers={"Origin": "http://dash.test", "Sec-Fetch-Site": "same-origin"},
        )
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"].lower()
        assert cookie.startswith(f"{COOKIE}=") and "httponly" in cookie and "samesite=strict" in cookie
        page = c.get("/")
        assert page.status_code == 200 and keys["alice"] not in page.text and 'id="viewer">alice<' in page.text
        out = c.post("/logout", follow_redirects=False, headers={"Origin": "http://dash.test"})
        assert out.status_code == 303 and f'{COOKIE}=""' in out.headers["set-cookie"]
        c.cookies.clear()
        assert c.get("/").status_code == 401
