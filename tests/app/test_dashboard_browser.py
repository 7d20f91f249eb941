"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against `kaudit serve` (API and
worker, SQLite). A correct kernel and a bf16-accumulating one are submitted; the bf16 kernel's page is opened while its
audit is still queued and must fill in stage by stage without a reload; the leaderboard must mark it as passing the
benchmark and failing the probes. Screenshots go to docs/screenshots/ (or $KAUDIT_SCREENSHOTS); the product views
(tables, live progress, canary plots, error pages) are driven and photographed by tests/app/test_dashboard_product.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from svc_support import ROOT, example, free_port, wait_for

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
STAGES = "intake,static,benchmark,probes"
SHOTS = Path(os.environ.get("KAUDIT_SCREENSHOTS", ROOT / "docs" / "screenshots"))
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, str]]:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "KAUDIT_CACHE_DIR" or (not k.startswith("KAUDIT_") and k not in ("DATABASE_URL", "REDIS_URL"))
    }
    out = tmp_path / "serve.out"
    with open(out, "wb") as fh:
        p = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "kaudit"),
                "serve",
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(port),
                "--stages",
                STAGES,
            ],
            cwd=tmp_path,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: "admin API key" in out.read_text(), 90, f"no key printed: {out.read_text() if out.exists() else ''}"
        )
        key = re.search(r"(ka_[A-Za-z0-9_-]+)", out.read_text()).group(1)  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(url), 60, "API not up")
        yield url, key
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _submit(url: str, key: str, name: str) -> str:
    r = httpx.post(url + "/v1/submissions", json=example(name), headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _finished(url: str, key: str, sid: str) -> bool:
    s = httpx.get(f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
    return s["status"] not in ("queued", "running")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install -y chromium)")
def test_dashboard_updates_live_marks_the_caught_kernel_and_plots(service: tuple[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    url, key = service
    SHOTS.mkdir(parents=True, exist_ok=True)
    fp32 = _submit(url, key, "pytorch_fp32")
    bf16 = _submit(url, key, "pytorch_bf16_accum")  # queued behind the fp32 audit: its page opens before it runs
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.add_init_script(
                "window.__updates = 0; document.addEventListener('kaudit:updated', () => window.__updates++);"
            )
            page.goto(f"{url}/submissions/{bf16}")
            assert page.get_attribute("#audit", "data-finished") == "false", "the audit finished before the page opened"
            page.evaluate("window.__sameDocument = true")
            # where it is: its place in the queue behind the fp32 audit, or the stage it has reached
            assert page.get_attribute("#progress", "data-status") in ("queued", "running")
            assert re.search(r"#\d+ in the queue|Running stage \w+ \(\d of \d\)", page.text_content("#progress") or "")

            # stage by stage, without a reload: the marker set on this document survives every update
            page.wait_for_selector('#audit [data-stage="intake"][data-status="passed"]', timeout=240_000)
            page.wait_for_selector('#audit [data-stage="benchmark"][data-status="passed"]', timeout=240_000)
            page.wait_for_selector('#audit [data-stage="probes"][data-status="failed"]', timeout=240_000)
            page.wait_for_selector('#audit[data-finished="true"]', timeout=120_000)
            assert page.evaluate("window.__sameDocument") is True
            # at least once in place (a poll may see several stages finish at once: how many polls an audit spans
            # is timing, not behaviour)
            assert page.evaluate("window.__updates") >= 1, "the page should have been updated as the audit ran"
            assert page.text_content("#audit-status") == "failed"

            # the error-vs-multiplicity plot, drawn by plotly.js from this server
            page.wait_for_selector('.plot[data-stage="probes"][data-drawn="true"] .plotly svg.main-svg', timeout=60_000)
            assert "index multiplicity" in (page.text_content('.plot[data-stage="probes"] .plotly .gtitle') or "")
            assert (
                page.locator('.plot[data-stage="probes"] .plotly .scatterlayer .trace').count() >= 2
            )  # probes + budget
            page.screenshot(path=str(SHOTS / "submission_bf16_probes.png"), full_page=True)

            wait_for(lambda: _finished(url, key, fp32), 240, "the fp32 audit did not finish")
            page.goto(f"{url}/problems/embedding_backward")
            caught = page.locator(f'tr[data-submission="{bf16}"]')
            assert caught.get_attribute("data-caught") == "true"
            assert caught.locator('a.badge[data-stage="benchmark"]').get_attribute("data-status") == "passed"
            probes_badge = caught.locator('a.badge[data-stage="probes"]')
            assert probes_badge.get_attribute("data-status") == "failed"
            assert probes_badge.get_attribute("href") == f"/submissions/{bf16}#stage-probes"
            assert caught.locator("td.audited-rank").text_content() == "—"
            assert "caught by probes" in (caught.text_content() or "")
            clean = page.locator(f'tr[data-submission="{fp32}"]')
            assert (
                clean.get_attribute("data-caught") == "false" and clean.locator("td.audited-rank").text_content() == "1"
            )
            page.screenshot(path=str(SHOTS / "leaderboard_caught_kernel.png"), full_page=True)

            page.goto(url + "/")
            assert page.locator('tr[data-problem="embedding_backward"] td.caught-count').text_content() == "1"

            # the badge leads to the stage's evidence
            page.goto(f"{url}/problems/embedding_backward")
            page.locator(f'tr[data-submission="{bf16}"] a.badge[data-stage="probes"]').click()
            page.wait_for_selector("#stage-probes details.evidence")
            assert page.url.endswith(f"/submissions/{bf16}#stage-probes")
        finally:
            browser.close()
    assert key not in " ".join(requests)
    assert all(r.startswith(url) for r in requests), (
        f"the pages fetched from elsewhere: {[r for r in requests if not r.startswith(url)]}"
    )
