"""Security headers on API and dashboard answers, and a Content-Security-Policy the dashboard's pages keep to: no
inline script runs without the request's nonce, no inline style is needed, and the one `<style>` element (the one
plotly.js fills through the CSSOM) carries that nonce."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from svc_support import bootstrap, example

from app.core.settings import Settings
from app.main import create_app

FIXED = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer"}


@pytest.fixture
def client(sqlite_settings: Settings) -> Iterator[tuple[TestClient, dict[str, str]]]:
    keys = bootstrap(sqlite_settings)
    with TestClient(create_app(sqlite_settings)) as c:
        yield c, keys


def _policy(response) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    for name, value in FIXED.items():
        assert response.headers.get(name) == value, (response.request.url, name, response.headers.get(name))
    csp = response.headers["content-security-policy"]
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in csp.split(";")) if d}


def _nonce(policy: dict[str, list[str]]) -> str:
    nonces = [s[len("'nonce-") : -1] for s in policy["script-src"] if s.startswith("'nonce-")]
    assert len(nonces) == 1, policy
    return nonces[0]


def _strict(policy: dict[str, list[str]]) -> None:
    for directive in ("script-src", "style-src"):
        assert "'unsafe-inline'" not in policy[directive] and "'unsafe-eval'" not in policy[directive], policy
    assert (
        policy["object-src"] == ["'none'"]
        and policy["frame-ancestors"] == ["'none'"]
        and policy["default-src"] == ["'self'"]
    )


def _inline_blocks_obey(html: str, nonce: str) -> None:
    """Every <script> without src is a data block (never executed) or carries the nonce; every <style> carries
    it; no element has a style attribute."""
    for tag in re.findall(r"<script\b[^>]*>", html):
        if "src=" not in tag:
            assert 'type="application/json"' in tag or f'nonce="{nonce}"' in tag, tag
    for tag in re.findall(r"<style\b[^>]*>", html):
        assert f'nonce="{nonce}"' in tag, tag
    assert not re.search(r"<[^>]+\sstyle\s*=", html), "an inline style attribute, which the policy refuses"


def test_api_answers_carry_the_security_headers(client) -> None:  # type: ignore[no-untyped-def]
    c, keys = client
    ok = c.get("/v1/problems")
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("application/json")
    _strict(_policy(ok))
    missing = c.get("/v1/submissions/" + "0" * 32, headers={"Authorization": f"Bearer {keys['alice']}"})
    assert missing.status_code == 404
    _strict(_policy(missing))  # errors too
    assert (
        c.get("/v1/problems").headers["content-security-policy"] != ok.headers["content-security-policy"]
    )  # a fresh nonce


def test_dashboard_pages_keep_to_a_strict_policy(client) -> None:  # type: ignore[no-untyped-def]
    c, keys = client
    sub = c.post("/v1/submissions", json=example("pytorch_fp32"), headers={"Authorization": f"Bearer {keys['alice']}"})
    assert sub.status_code == 202, sub.text
    sid = sub.json()["id"]
    for path in ("/", "/problems/embedding_backward", f"/submissions/{sid}", f"/submissions/{sid}/live", "/login"):
        r = c.get(path)
        assert r.status_code == 200, (path, r.status_code)
        policy = _policy(r)
        _strict(policy)
        _inline_blocks_obey(r.text, _nonce(policy))
    page = c.get(f"/submissions/{sid}")
    nonce = _nonce(_policy(page))
    # plotly.js finds this element by its id and adds its rules through the CSSOM instead of inserting a <style>
    assert f'<style id="plotly.js-style-global" nonce="{nonce}">' in page.text
    assert (
        '<script src="/static/plotly.min.js">' in page.text and '<script src="/static/dashboard.js" defer>' in page.text
    )


def test_api_docs_run_their_inline_script_by_nonce(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    assert c.get("/redoc", follow_redirects=False).headers["location"] == "/docs"
    for path in ("/docs",):
        r = c.get(path)
        assert r.status_code == 200
        policy = _policy(r)
        assert "'unsafe-inline'" not in policy["script-src"] and "https:" not in str(policy)
        nonce = _nonce(policy)
        for tag in re.findall(r"<script\b[^>]*>", r.text):
            assert "src=" in tag or f'nonce="{nonce}"' in tag, (path, tag)
