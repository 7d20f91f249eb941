"""The dashboard under its Content-Security-Policy in a real browser (Debian's headless Chromium, Playwright): a
submission page draws its plotly figure, plotly's own CSS rules apply (through the nonce'd `<style>` element), and
the browser reports no violation of the policy on it or on the other pages."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from svc_support import Proc, bootstrap, env_for, example, free_port, wait_for

from app.audits import events, repository
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.main import create_app

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# what the probes stage stores, enough for one error-vs-multiplicity figure
PROBES_METRICS: dict[str, Any] = {
    "probes": {
        "heavy_hitters": {
            "outputs": {
                "grad": {
                    "bucket_kind": "index_count",
                    "max_ratio": 2.0,
                    "buckets": [
                        {"lo": 1, "mean_label": 1, "ratio": 1.0, "groups": 5},
                        {"lo": 2, "mean_label": 3, "ratio": 1.6, "groups": 5},
                        {"lo": 8, "mean_label": 10, "ratio": 4.0, "groups": 5},
                    ],
                }
            }
        }
    }
}


def _finished_submission(settings: Settings, key: str) -> str:
    with TestClient(create_app(settings)) as api:
        r = api.post("/v1/submissions", json=example("pytorch_fp32"), headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 202, r.text
        sid, audit = r.json()["id"], r.json()["audit_id"]
    engine = make_engine(settings)
    try:
        sessions = make_sessionmaker(engine)
        with sessions.begin() as s:
            assert repository.claim(s, audit, "w", 60)
            repository.store_stage(
                s,
                audit,
                "w",
                name="probes",
                position=3,
                status="failed",
                summary="over budget",
                metrics=PROBES_METRICS,
                evidence={},
                duration_s=1,
                lease_s=60,
            )
        with sessions.begin() as s:
            assert repository.finish(s, audit, "w", "failed", "fail", "caught by probes")
            events.audit_completed(s, audit)
    finally:
        engine.dispose()
    return sid


@pytest.fixture
def dashboard(sqlite_settings: Settings, tmp_path: Path) -> Iterator[tuple[str, str]]:
    keys = bootstrap(sqlite_settings)
    sid = _finished_submission(sqlite_settings, keys["alice"])
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
    ]
    proc = Proc(argv, env_for(sqlite_settings), tmp_path / "uvicorn.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _live(url), 60, "uvicorn did not start", proc)
        yield url, sid
    finally:
        proc.stop()


def _live(url: str) -> bool:
    try:
        return httpx.get(url + "/livez", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_submission_page_draws_its_plot_with_no_policy_violation(dashboard: tuple[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    url, sid = dashboard
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        try:
            page = browser.new_page()
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text))
            page.add_init_script(
                "window.__violations = []; document.addEventListener('securitypolicyviolation', "
                "e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI + ' ' + e.sample + ' ' + e.sourceFile + ':' + e.lineNumber));"
            )
            response = page.goto(f"{url}/submissions/{sid}")
            assert response is not None and "script-src 'self' 'nonce-" in response.headers["content-security-policy"]
            page.wait_for_selector('.plot[data-stage="probes"][data-drawn="true"] .plotly svg.main-svg', timeout=60_000)
            assert (
                page.locator('.plot[data-stage="probes"] .plotly .scatterlayer .trace').count() >= 2
            )  # probe + budget
            # a rule plotly.js adds to its global stylesheet: it reached the page through the nonce'd element
            position = page.evaluate(
                "getComputedStyle(document.querySelector('.js-plotly-plot .plotly .modebar')).position"
            )
            assert position == "absolute"
            assert page.evaluate("window.__violations") == []
            for path in ("/", "/problems/embedding_backward", "/login"):  # the other pages, and the login form
                page.goto(url + path)
                page.wait_for_load_state("load")
                assert page.evaluate("window.__violations") == [], path
            assert not [m for m in console if "Content Security Policy" in m or "strict CSP" in m], console
            # and the policy is in force: an injected inline script does not run, and the browser says why
            ran = page.evaluate(
                "() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1';"
                " document.head.appendChild(s); return window.__ran === 1; }"
            )
            assert ran is False and any(v.startswith("script-src") for v in page.evaluate("window.__violations"))
        finally:
            browser.close()
