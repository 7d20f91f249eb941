"""End to end against the real services: uvicorn over HTTP, Postgres, Redis, and a real Celery worker process."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from svc_support import bootstrap, example, start_api, start_worker, wait_for

from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.models import StageResultRow

pytestmark = [pytest.mark.services, pytest.mark.slow]

STATUS_OF = {"pass": "passed", "fail": "failed", "error": "error"}


def _finished(url: str, key: str, sid: str):  # type: ignore[no-untyped-def]
    def check():  # type: ignore[no-untyped-def]
        s = httpx.get(f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
        return s if s["status"] not in ("queued", "running") else None

    return check


def test_submit_over_http_worker_audits_get_shows_verdict(service_settings: Settings, tmp_path: Path) -> None:
    keys = bootstrap(service_settings)
    api, url = start_api(service_settings, tmp_path / "api.log")
    worker = start_worker(service_settings, tmp_path / "worker.log")
    try:
        h = {"Authorization": f"Bearer {keys['alice']}"}
        good = httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10)
        assert good.status_code == 202, good.text
        no_run = example("pytorch_fp32")
        no_run["sources"][0]["content"] = no_run["sources"][0]["content"].replace("def run(", "def not_run(")
        r = httpx.post(
            f"{url}/v1/submissions", json=no_run, headers=h, timeout=10
        )  # answered at POST, not after the queue
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "spec.entry_point", r.text
        broken = example("pytorch_fp32")
        broken["name"] = "no_import"
        broken["sources"][0]["content"] = "import no_such_module_kaudit\n" + broken["sources"][0]["content"]
        bad = httpx.post(f"{url}/v1/submissions", json=broken, headers=h, timeout=10)
        assert bad.status_code == 202

        s = wait_for(_finished(url, keys["alice"], good.json()["id"]), 120, "good audit did not finish", worker)
        assert s["status"] == "passed" and s["verdict"] == "pass", s
        names = [st["name"] for st in s["stages"]]
        assert names == ["intake", "static", "benchmark", "probes", "canary", "verdict"]
        intake = s["stages"][0]
        assert intake["status"] == "passed" and intake["metrics"]["source_bytes"] > 0
        assert all(st["status"] == "skipped" for st in s["stages"][1:5])  # KAUDIT_AUDIT_STAGES=intake
        assert s["seed"] is not None and s["finished_at"] is not None

        b = wait_for(_finished(url, keys["alice"], bad.json()["id"]), 120, "bad audit did not finish", worker)
        assert b["status"] == "failed" and b["verdict"] == "fail"
        assert b["stages"][0]["status"] == "failed" and "does not import" in b["stages"][0]["summary"]
        assert "caught by intake" in b["summary"]

        # no CUDA (not even torch) in the Celery parent; the pool process that ran the audits has torch loaded
        parent_maps = Path(f"/proc/{worker.p.pid}/maps").read_text()
        assert "libtorch" not in parent_maps and "libcuda" not in parent_maps
        children = [int(c) for c in Path(f"/proc/{worker.p.pid}/task/{worker.p.pid}/children").read_text().split()]
        assert any("libtorch" in Path(f"/proc/{c}/maps").read_text() for c in children)
    finally:
        worker.kill()
        api.kill()


def test_live_stage_results_with_more_stages(service_settings: Settings, tmp_path: Path) -> None:
    """intake+static+benchmark: every requested stage is stored once; the status is the worst stage."""
    settings = service_settings.model_copy(update={"audit_stages": "intake,static,benchmark"})
    keys = bootstrap(settings)
    api, url = start_api(settings, tmp_path / "api.log")
    worker = start_worker(settings, tmp_path / "worker.log")
    try:
        r = httpx.post(
            f"{url}/v1/submissions", json=example("pytorch_fp32"), headers={"X-API-Key": keys["bob"]}, timeout=10
        )
        s = wait_for(_finished(url, keys["bob"], r.json()["id"]), 300, "audit did not finish", worker)
        by = {st["name"]: st for st in s["stages"]}
        for name in ("intake", "static", "benchmark"):
            assert by[name]["status"] in ("passed", "failed", "error"), by[name]
        assert by["probes"]["status"] == by["canary"]["status"] == "skipped"
        worst = (
            "error"
            if any(by[n]["status"] == "error" for n in by if n != "verdict")
            else ("failed" if any(by[n]["status"] == "failed" for n in by if n != "verdict") else "passed")
        )
        assert s["status"] == worst and STATUS_OF[s["verdict"]] == worst
        # a correct fp32-accumulating kernel passes the benchmark, and is then ranked by its measured time
        assert by["benchmark"]["status"] == "passed", by["benchmark"]["summary"]
        kernel_ms = by["benchmark"]["metrics"]["kernel_median_ms"]
        rows = httpx.get(f"{url}/v1/leaderboard/embedding_backward", timeout=5).json()["rows"]
        assert [(r["submitter"], r["submission_id"], r["kernel_ms"], r["passes_benchmark"]) for r in rows] == [
            ("bob", s["id"], kernel_ms, True)
        ]
        assert rows[0]["numerically_sound"] is None  # probes were not run
        engine = make_engine(settings)
        with make_sessionmaker(engine)() as sess:
            per_stage = sess.execute(select(StageResultRow.name, func.count()).group_by(StageResultRow.name)).all()
        engine.dispose()
        assert all(n == 1 for _, n in per_stage) and len(per_stage) == 6
    finally:
        worker.kill()
        api.kill()


def test_traces_over_http_follow_the_latest_audit(service_settings: Settings, tmp_path: Path) -> None:
    """GET /v1/submissions/{id}/traces: one SOL-ExecBench trace per evaluated workload, to the owner only."""
    settings = service_settings.model_copy(update={"audit_stages": "intake,static,benchmark"})
    keys = bootstrap(settings)
    api, url = start_api(settings, tmp_path / "api.log")
    worker = start_worker(settings, tmp_path / "worker.log")
    try:
        h = {"Authorization": f"Bearer {keys['alice']}"}
        good = httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10)
        assert good.status_code == 202, good.text
        sid = good.json()["id"]
        wait_for(_finished(url, keys["alice"], sid), 240, "the audit did not finish", worker)
        r = httpx.get(f"{url}/v1/submissions/{sid}/traces", headers=h, timeout=10)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "passed" and body["traces"], body
        assert {t["evaluation"]["status"] for t in body["traces"]} == {"PASSED"}
        assert all(
            t["definition"] == good.json().get("problem", t["definition"]) and t["workload"]["uuid"]
            for t in body["traces"]
        )
        other = httpx.get(
            f"{url}/v1/submissions/{sid}/traces", headers={"Authorization": f"Bearer {keys['bob']}"}, timeout=10
        )
        assert other.status_code == 404
    finally:
        worker.kill()
        api.kill()
