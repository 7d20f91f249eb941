"""What a caught kernel puts in its result (exception text, output, file names, evidence keys) cannot break storing
it: NUL and lone surrogates are stored cleaned, and a failure stays a failure (real Postgres; the second test runs
a real Celery worker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from svc_support import bootstrap, example, start_worker, wait_for

from app.audits import repository, results
from app.audits.queue import AuditQueue
from app.auth.principal import Principal
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.jobs.celery import make_celery
from app.main import create_app
from app.models import ApiKey, StageResultRow
from app.submissions import service as submissions
from worker.catalogue import load_catalogue

pytestmark = [pytest.mark.services]

HOSTILE = "bad\x00byte and \ud800 lone"
CLEAN = "bad\ufffdbyte and \ufffd lone"


@pytest.fixture
def api(service_settings: Settings) -> Iterator[tuple[TestClient, dict[str, str], Settings]]:
    keys = bootstrap(service_settings)
    with TestClient(create_app(service_settings)) as client:
        yield client, keys, service_settings


def _finished(client: TestClient, key: str, sid: str):  # type: ignore[no-untyped-def]
    def check():  # type: ignore[no-untyped-def]
        s = client.get(f"/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}).json()
        return s if s["status"] not in ("queued", "running") else None

    return check


def test_a_stage_with_nul_and_lone_surrogates_is_stored_and_read_back_failed(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, settings = api
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    try:
        with UnitOfWork(sessions, AuditQueue(make_celery(settings))) as uow:
            key = uow.session.scalar(select(ApiKey).where(ApiKey.submitter == "alice"))
            alice = Principal(key.id, key.submitter, frozenset({"submit"}))
            sol = example("pytorch_fp32")
            acc = submissions.submit(
                uow,
                settings,
                alice,
                problem_name="embedding_backward",
                problem_hash=load_catalogue().get("embedding_backward").content_hash,
                solution_name=sol["name"],
                data=sol,
                idempotency_key=None,
            )
        with sessions.begin() as s:
            assert repository.claim(s, acc.audit_id, "w1", settings.lease_s) is not None
        with sessions.begin() as s:
            assert repository.store_stage(
                s,
                acc.audit_id,
                "w1",
                name="intake",
                position=0,
                status="failed",
                summary=f"the solution does not import: ValueError: {HOSTILE}",
                metrics={f"m{HOSTILE}": 1.0, "deep": [{"k\udfff": "\x00"}]},
                evidence={"log": f"stdout: {HOSTILE}", f"file\x00{HOSTILE}.py": ["a\ud800.py"]},
                duration_s=0.1,
                lease_s=settings.lease_s,
            )
            assert repository.finish(s, acc.audit_id, "w1", "failed", "fail", f"fail: caught by intake: {HOSTILE}")
    finally:
        engine.dispose()

    got = client.get(f"/v1/submissions/{acc.submission_id}", headers={"Authorization": f"Bearer {keys['alice']}"})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["status"] == "failed" and body["verdict"] == "fail"  # the verdict survived storage
    assert body["summary"] == f"fail: caught by intake: {CLEAN}"
    (intake,) = body["stages"]
    assert intake["status"] == "failed" and intake["summary"].endswith(CLEAN)
    assert intake["metrics"] == {f"m{CLEAN}": 1.0, "deep": [{"k\ufffd": "\ufffd"}]}
    assert intake["evidence"] == {"log": f"stdout: {CLEAN}", f"file\ufffd{CLEAN}.py": ["a\ufffd.py"]}


def test_a_result_the_database_refuses_is_stored_with_its_status(api) -> None:  # type: ignore[no-untyped-def]
    """Whatever else refuses a result's details (here an integer JSON cannot write), its status is stored: how a
    result is stored never turns a failure into an error, and no SQL reaches what is stored."""
    _, _, settings = api
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    try:
        with UnitOfWork(sessions, AuditQueue(make_celery(settings))) as uow:
            key = uow.session.scalar(select(ApiKey).where(ApiKey.submitter == "alice"))
            sol = example("pytorch_fp32")
            acc = submissions.submit(
                uow,
                settings,
                Principal(key.id, key.submitter, frozenset({"submit"})),
                problem_name="embedding_backward",
                problem_hash=load_catalogue().get("embedding_backward").content_hash,
                solution_name=sol["name"],
                data=sol,
                idempotency_key=None,
            )
        with sessions.begin() as s:
            assert repository.claim(s, acc.audit_id, "w1", settings.lease_s) is not None
        record = results.StageRecord(
            name="probes",
            position=3,
            status="failed",
            summary="error grows with multiplicity",
            metrics={"count": 10**5000},
            evidence={},
            duration_s=1.0,
        )
        assert results.store(sessions, acc.audit_id, "w1", record, lease_s=settings.lease_s)
        with sessions() as s:
            row = s.scalar(select(StageResultRow).where(StageResultRow.audit_id == acc.audit_id))
            assert (row.name, row.status) == ("probes", "failed")
            assert "could not be stored" in row.summary and "SQL" not in row.summary and row.metrics == {}
            assert repository.failed_stages(s, acc.audit_id) == ["probes"]
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_kernel_raising_nul_and_a_lone_surrogate_stays_failed(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On the code before the fix the stage could not be stored: the audit ended `error`, its summary the SQL."""
    client, keys, settings = api
    worker = start_worker(settings, tmp_path / "worker.log")
    try:
        sol = example("pytorch_fp32")
        sol["name"] = "raises_nul_and_surrogate"
        sol["sources"][0]["content"] = (
            'raise ValueError("bad\\x00byte and \\ud800 lone")\n' + sol["sources"][0]["content"]
        )
        r = client.post("/v1/submissions", json=sol, headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code == 202, r.text
        s = wait_for(_finished(client, keys["alice"], r.json()["id"]), 180, "the audit did not finish", worker)
    finally:
        worker.kill()
    assert s["status"] == "failed" and s["verdict"] == "fail", s["summary"]
    assert "SQL" not in s["summary"] and "INSERT" not in s["summary"]
    intake = s["stages"][0]
    assert intake["name"] == "intake" and intake["status"] == "failed"
    assert f"ValueError: {CLEAN}" in intake["summary"], intake["summary"]
    assert s["stages"][-1]["name"] == "verdict" and s["stages"][-1]["status"] == "failed"
