"""A new stage is one package plus one registry line: a stage written outside the project, as the README's "A stage"
says (a package on the import path, named in KAUDIT_EXTRA_STAGES), reaches the submission API, the dashboard's
audit page, both leaderboards and the webhooks, through uvicorn, Postgres, Redis and a real Celery worker, with no
other edit. The API process is not given the package: it knows the stage by name only."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from markupsafe import escape
from standardwebhooks import Webhook
from svc_support import ROOT, bootstrap, drop_queue, start_api, start_worker, wait_for
from webhook_receiver import Receiver

from app.core.settings import Settings

# the README's example stage, as a user writes it: the package my_stages/dummy/ on the worker's import path
DUMMY_STAGE = """\
from worker.context import AuditContext
from worker.report import StageResult, StageStatus

def run(ctx: AuditContext) -> StageResult:
    lines = sum(len(source.content.splitlines()) for source in ctx.solution.sources)
    return StageResult(name="dummy", status=StageStatus.passed, metrics={"lines": lines},
                       summary=f"dummy: read {lines} lines of {ctx.solution.name}")
"""
PROBLEM = "softmax"  # a correct fp32 kernel the benchmark times in a second or two on a CPU
SOLUTION = ROOT / "kernels" / PROBLEM / "solutions" / "pytorch_fp32" / "solution.json"


def test_the_readme_shows_this_stage() -> None:
    assert textwrap.indent(DUMMY_STAGE, "  ", lambda line: bool(line.strip())) in (ROOT / "README.md").read_text()
    assert "KAUDIT_EXTRA_STAGES=my_stages.dummy" in (ROOT / "README.md").read_text()


def _stage_package(root: Path) -> Path:
    package = root / "my_stages" / "dummy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(DUMMY_STAGE)
    return root


def _finished(url: str, key: str, sid: str) -> dict[str, Any] | None:
    s: dict[str, Any] = httpx.get(
        f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=5
    ).json()
    return s if s["status"] not in ("queued", "running") else None


@pytest.mark.services
@pytest.mark.slow
def test_a_stage_from_a_package_and_one_setting_reaches_api_dashboard_boards_and_webhooks(
    service_settings: Settings, tmp_path: Path
) -> None:
    settings = service_settings.model_copy(
        update={
            "extra_stages": "my_stages.dummy",
            "audit_stages": "intake,benchmark,dummy",
            "webhook_allowlist": "127.0.0.1/32",
            "webhook_sweep_interval_s": 0.1,
            "webhook_backoff_base_s": 0.05,
        }
    )
    keys = bootstrap(settings)
    h = {"Authorization": f"Bearer {keys['alice']}"}
    pythonpath = os.pathsep.join(
        p for p in (str(_stage_package(tmp_path / "src")), os.environ.get("PYTHONPATH", "")) if p
    )
    api, url = start_api(settings, tmp_path / "api.log")
    worker = start_worker(
        settings,
        tmp_path / "worker.log",
        "dummy",
        f"{settings.audit_queue},{settings.webhook_queue}",
        PYTHONPATH=pythonpath,
    )
    try:
        with Receiver() as rx:
            hook = httpx.post(
                f"{url}/v1/webhooks",
                json={"url": rx.url, "events": ["audit.stage_completed", "audit.completed"]},
                headers=h,
                timeout=10,
            )
            assert hook.status_code == 201, hook.text
            solution = json.loads(SOLUTION.read_text())
            posted = httpx.post(f"{url}/v1/submissions", json=solution, headers=h, timeout=10)
            assert posted.status_code == 202, posted.text
            sid = posted.json()["id"]
            lines = len(solution["sources"][0]["content"].splitlines())
            summary = f"dummy: read {lines} lines of {solution['name']}"

            # the API: the stage in its place, before the verdict, with its status and summary
            s = wait_for(lambda: _finished(url, keys["alice"], sid), 120, "the audit did not finish", worker)
            assert [st["name"] for st in s["stages"]] == [
                "intake",
                "static",
                "benchmark",
                "probes",
                "canary",
                "dummy",
                "verdict",
            ]
            by = {st["name"]: st for st in s["stages"]}
            assert (by["dummy"]["status"], by["dummy"]["summary"], by["dummy"]["metrics"]) == (
                "passed",
                summary,
                {"lines": lines},
            )
            assert by["benchmark"]["status"] == "passed" and s["status"] == "passed", s
            assert "dummy" in by["verdict"]["summary"]  # "pass: intake, benchmark, dummy passed"

            # the dashboard's audit page, as its owner sees it (logged in through the key form): the stage's card,
            # its status and its summary
            with httpx.Client(base_url=url, timeout=10) as browser:
                page = browser.post(
                    "/key", data={"key": keys["alice"], "next": f"/submissions/{sid}"}, follow_redirects=True
                )
            assert page.status_code == 200 and page.url.path == f"/submissions/{sid}"
            assert '<article class="stage" id="stage-dummy" data-stage="dummy" data-status="passed">' in page.text
            assert str(escape(summary)) in page.text

            # both leaderboards: the API's row and the dashboard's badge
            rows = httpx.get(f"{url}/v1/leaderboard/{PROBLEM}", timeout=10).json()["rows"]
            assert [(r["submission_id"], r["stages"]) for r in rows] == [
                (
                    sid,
                    {
                        "intake": "passed",
                        "static": "skipped",
                        "benchmark": "passed",
                        "probes": "skipped",
                        "canary": "skipped",
                        "dummy": "passed",
                    },
                )
            ]
            board = httpx.get(f"{url}/problems/{PROBLEM}", timeout=10).text
            assert re.search(
                rf'data-stage="dummy" data-status="passed"\s+href="/submissions/{sid}#stage-dummy"', board
            ), board

            # the webhooks, signed: the stage's own event, and its status in audit.completed
            wh = Webhook(hook.json()["secret"])
            [stage] = rx.received(1, where=lambda r: r.json["data"].get("stage") == "dummy")
            [done] = rx.received(1, where=lambda r: r.json["type"] == "audit.completed")
            data = wh.verify(stage.body, stage.headers)["data"]
            assert (data["submission_id"], data["status"], data["summary"]) == (sid, "passed", summary)
            assert wh.verify(done.body, done.headers)["data"]["stages"]["dummy"] == "passed"
    finally:
        worker.kill()
        api.kill()
        drop_queue(settings.webhook_queue)
