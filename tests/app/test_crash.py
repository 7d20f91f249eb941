"""Crash tests: SIGKILL a worker mid-audit, restart Redis with work queued; nothing committed is lost or done twice."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import func, select
from svc_support import (
    REDIS_URL,
    bootstrap,
    example,
    kill_tree,
    restart_redis,
    sandbox_started,
    slow_import_solution,
    start_api,
    start_worker,
    wait_for,
)

from app.audits import repository
from app.audits.tasks import run_one
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.jobs.resources import ProcessLocal
from app.models import Audit, StageResultRow, Submission
from tests.proc_support import sandbox_children_under

pytestmark = [pytest.mark.services, pytest.mark.slow]
STAGES = ["intake", "static", "benchmark", "probes", "canary", "verdict"]


def _status(url: str, key: str, sid: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()


def _db(settings: Settings):  # type: ignore[no-untyped-def]
    return make_sessionmaker(make_engine(settings))


def _assert_exactly_once(settings: Settings, sids: list[str]) -> None:
    sessions = _db(settings)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Submission)) == len(sids)
        for sid in sids:
            audits = list(s.scalars(select(Audit).where(Audit.submission_id == sid)))
            assert len(audits) == 1 and audits[0].status == "passed", [(a.status, a.summary) for a in audits]
            names = list(
                s.scalars(
                    select(StageResultRow.name)
                    .where(StageResultRow.audit_id == audits[0].id)
                    .order_by(StageResultRow.position)
                )
            )
            assert names == STAGES  # one row per stage: no duplicates, none missing


def test_sigkill_mid_audit_is_completed_once_by_another_worker(service_settings: Settings, tmp_path: Path) -> None:
    keys = bootstrap(service_settings)
    h = {"Authorization": f"Bearer {keys['alice']}"}
    api, url = start_api(service_settings, tmp_path / "api.log")
    w1 = start_worker(service_settings, tmp_path / "w1.log", "w1")
    w2 = None
    try:
        slow = httpx.post(f"{url}/v1/submissions", json=slow_import_solution(40), headers=h, timeout=10).json()["id"]
        wait_for(
            lambda: _status(url, keys["alice"], slow)["status"] == "running" and sandbox_started(w1.p.pid),
            90,
            "the audit never started",
            w1,
        )
        sessions = _db(service_settings)
        with sessions() as s:
            first_owner = s.scalar(select(Audit.lease_owner).where(Audit.submission_id == slow))
        kill_tree(w1)  # SIGKILL, mid-audit: the submission's import is sleeping inside intake
        queued_meanwhile = httpx.post(
            f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10
        ).json()["id"]
        assert _status(url, keys["alice"], slow)["status"] == "running"  # the lease is still held by the dead worker

        w2 = start_worker(service_settings, tmp_path / "w2.log", "w2")
        for sid in (slow, queued_meanwhile):
            wait_for(
                lambda sid=sid: _status(url, keys["alice"], sid)["status"] not in ("queued", "running"),
                120,
                f"{sid} was not completed after the crash",
                w2,
            )
        _assert_exactly_once(service_settings, [slow, queued_meanwhile])
        with sessions() as s:
            audit = s.scalar(select(Audit).where(Audit.submission_id == slow))
            workers = set(s.scalars(select(StageResultRow.worker).where(StageResultRow.audit_id == audit.id)))
        assert audit.claims == 2 and audit.lease_owner is None
        assert first_owner not in workers and len(workers) == 1  # every result came from the worker that finished it
    finally:
        kill_tree(w1)
        if w2 is not None:
            kill_tree(w2)
        api.kill()


def test_redis_restart_loses_no_committed_submission(service_settings: Settings, tmp_path: Path) -> None:
    keys = bootstrap(service_settings)
    h = {"Authorization": f"Bearer {keys['bob']}"}
    api, url = start_api(service_settings, tmp_path / "api.log")
    worker = None
    try:
        before = [
            httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10).json()["id"]
            for _ in range(3)
        ]
        r = redis.Redis.from_url(REDIS_URL)
        assert r.llen(service_settings.audit_queue) == 3  # enqueued after commit
        restart_redis()
        assert r.llen(service_settings.audit_queue) == 0  # the broker lost them
        after = httpx.post(f"{url}/v1/submissions", json=example("pytorch_fp32"), headers=h, timeout=10)
        assert after.status_code == 202  # the API reconnects to the new Redis
        worker = start_worker(service_settings, tmp_path / "worker.log")
        sids = [*before, after.json()["id"]]
        for sid in sids:
            wait_for(
                lambda sid=sid: _status(url, keys["bob"], sid)["status"] not in ("queued", "running"),
                180,
                f"{sid} was lost with the Redis restart",
                worker,
            )
        _assert_exactly_once(service_settings, sids)
    finally:
        if worker is not None:
            kill_tree(worker)
        api.kill()


def test_redelivery_of_finished_or_leased_audit_is_a_noop(service_settings: Settings, tmp_path: Path) -> None:
    """At-least-once delivery: a second copy of the task must not run the audit again."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    keys = bootstrap(service_settings)
    with TestClient(create_app(service_settings)) as client:
        ids = [
            client.post("/v1/submissions", json=example("pytorch_fp32"), headers={"X-API-Key": keys["alice"]}).json()[
                "audit_id"
            ]
            for _ in range(2)
        ]
    local = ProcessLocal(service_settings)
    sessions = local.get().sessions
    assert run_one(local, ids[0]) == "passed"
    assert run_one(local, ids[0]) == "noop"  # finished: nothing happens
    with sessions.begin() as s:
        assert repository.claim(s, ids[1], "someone-else", lease_s=60) is not None
    assert run_one(local, ids[1]) == "noop"  # leased by a live worker: nothing happens
    with sessions() as s:
        counts = dict(s.execute(select(StageResultRow.audit_id, func.count()).group_by(StageResultRow.audit_id)).all())
        claims = dict(s.execute(select(Audit.id, Audit.claims)).all())
    assert counts == {ids[0]: 6} and claims == {ids[0]: 1, ids[1]: 1}
    local.get().engine.dispose()


def test_resumed_audit_keeps_stages_stored_before_the_crash(service_settings: Settings) -> None:
    """A worker died after storing intake: the next one skips intake and stores only the rest, once."""
    import time

    from fastapi.testclient import TestClient

    from app.main import create_app

    keys = bootstrap(service_settings)
    with TestClient(create_app(service_settings)) as client:
        aid = client.post("/v1/submissions", json=example("pytorch_fp32"), headers={"X-API-Key": keys["alice"]}).json()[
            "audit_id"
        ]
    local = ProcessLocal(service_settings)
    sessions = local.get().sessions
    with sessions.begin() as s:
        assert repository.claim(s, aid, "dead-worker", lease_s=0.5) is not None
        assert repository.store_stage(
            s,
            aid,
            "dead-worker",
            name="intake",
            position=0,
            status="passed",
            summary="from the dead worker",
            metrics={"source_bytes": 1},
            evidence={},
            duration_s=1.0,
            lease_s=0.5,
        )
    time.sleep(1.0)  # its lease expires
    assert run_one(local, aid) == "passed"
    with sessions() as s:
        rows = list(
            s.scalars(select(StageResultRow).where(StageResultRow.audit_id == aid).order_by(StageResultRow.position))
        )
        audit = s.get(Audit, aid)
    assert [r.name for r in rows] == STAGES
    assert rows[0].summary == "from the dead worker" and rows[0].worker == "dead-worker"
    assert {r.worker for r in rows[1:]} != {"dead-worker"} and audit.claims == 2
    local.get().engine.dispose()


def _pool_processes(worker_pid: int) -> list[int]:
    """The Celery prefork pool's processes: the worker's direct children forked from it (same command line)."""
    out = []
    argv = Path(f"/proc/{worker_pid}/cmdline").read_bytes()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (
                    int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == worker_pid
                    and (d / "cmdline").read_bytes() == argv
                ):
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def test_celery_soft_time_limit_ends_the_audit_timed_out_and_kills_the_sandbox(
    service_settings: Settings, tmp_path: Path
) -> None:
    """A real Celery worker: the soft limit interrupts the audit while the submission's import sleeps in its sandbox;
    the audit ends timed_out (not re-run, not error) and the sandbox child is gone.

    The soft limit is delivered the way billiard's pool delivers it (SIGUSR1 to the pool process), once the sandbox
    is seen running: the test waits on that event rather than racing a short limit against a busy machine."""
    import signal

    settings = Settings.model_validate(
        {**service_settings.model_dump(), "soft_time_limit_s": 600, "hard_time_limit_s": 900}
    )
    keys = bootstrap(settings)
    h = {"Authorization": f"Bearer {keys['alice']}"}
    api, url = start_api(settings, tmp_path / "api.log")
    sandboxes = tmp_path / "tmp"
    sandboxes.mkdir()
    worker = start_worker(settings, tmp_path / "w.log", "soft", TMPDIR=str(sandboxes))
    try:
        # ready: its start-up isolation check (which runs a sandbox of its own) is over
        wait_for(lambda: "ready." in worker.tail(), 300, "the worker never became ready", worker)
        sid = httpx.post(f"{url}/v1/submissions", json=slow_import_solution(600), headers=h, timeout=10).json()["id"]
        wait_for(lambda: sandbox_started(worker.p.pid), 300, "the audit never started", worker)
        assert sandbox_children_under(sandboxes), "the submission should be sleeping in its sandbox"
        for pid in _pool_processes(worker.p.pid):
            os.kill(pid, signal.SIGUSR1)  # billiard's soft time limit signal
        final = wait_for(
            lambda: (s := _status(url, keys["alice"], sid))["status"] not in ("queued", "running") and s,
            120,
            "the audit never ended",
            worker,
        )
        assert final["status"] == "timed_out" and "ran past its 600 s limit" in final["summary"], final
        wait_for(
            lambda: sandbox_children_under(sandboxes) == [],
            30,
            "the sandbox child outlived the timed-out audit",
            worker,
        )
        with _db(settings)() as s:
            assert s.scalar(select(Audit.claims).where(Audit.submission_id == sid)) == 1  # ended, not re-queued
    finally:
        kill_tree(worker)
        api.kill()
