"""The webhook outbox against real Postgres: rows are written in the transaction of the change, go only to the
endpoints that should see them, and stay one per (event, endpoint) however often the change is reported."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import select
from svc_support import bootstrap, example

from app.audits import events, repository
from app.audits.tasks import run_one
from app.auth.principal import Principal
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.jobs.resources import ProcessLocal
from app.models import ApiKey, StageResultRow, WebhookDelivery
from app.submissions import service as submissions
from app.webhooks import endpoints
from worker.catalogue import load_catalogue

pytestmark = [pytest.mark.services]


@pytest.fixture
def db(service_settings: Settings):  # type: ignore[no-untyped-def]
    bootstrap(service_settings)
    engine = make_engine(service_settings)
    yield service_settings, make_sessionmaker(engine)
    engine.dispose()


def _principal(session, submitter: str) -> Principal:  # type: ignore[no-untyped-def]
    key = session.scalar(select(ApiKey).where(ApiKey.submitter == submitter))
    return Principal(key.id, key.submitter, frozenset(key.scopes.split(",")))


def _submit(settings: Settings, sessions, submitter: str, solution: dict) -> str:  # type: ignore[no-untyped-def, type-arg]
    with UnitOfWork(sessions, None) as uow:  # no broker: this test runs the audit itself
        p = _principal(uow.session, submitter)
        phash = load_catalogue().get("embedding_backward").content_hash
        return submissions.submit(
            uow,
            settings,
            p,
            problem_name="embedding_backward",
            problem_hash=phash,
            solution_name=solution["name"],
            data=solution,
            idempotency_key=None,
        ).audit_id


def _rows(sessions, endpoint_id: str) -> Counter[str]:  # type: ignore[no-untyped-def]
    with sessions() as s:
        return Counter(s.scalars(select(WebhookDelivery.event).where(WebhookDelivery.endpoint_id == endpoint_id)))


def test_an_audit_run_twice_writes_one_audit_completed_per_endpoint(db) -> None:  # type: ignore[no-untyped-def]
    settings, sessions = db
    with sessions.begin() as s:
        mine = endpoints.create(
            s,
            _principal(s, "alice").key_id,
            "https://hooks.example/a",
            ["submission.received", "audit.stage_completed", "audit.completed"],
        ).id
        others = endpoints.create(s, _principal(s, "bob").key_id, "https://hooks.example/b", ["audit.completed"]).id
        admins = endpoints.create(s, _principal(s, "admin").key_id, "https://hooks.example/c", ["audit.completed"]).id
    broken = example("pytorch_fp32")
    broken["name"] = "no_run"
    broken["sources"][0]["content"] = "1 / 0  # fails on import, in the sandbox\n" + broken["sources"][0]["content"]
    audit_id = _submit(settings, sessions, "alice", broken)
    assert _rows(sessions, mine) == {"submission.received": 1}

    local = ProcessLocal(settings)
    assert run_one(local, audit_id) == "failed"
    assert run_one(local, audit_id) == "noop"  # the task delivered a second time
    with sessions.begin() as s:  # the change reported again (a reaper racing the worker): still one row
        events.audit_completed(s, audit_id)
        events.stage_completed(s, audit_id, "intake", "failed", "again")

    with sessions() as s:
        stages = len(s.scalars(select(StageResultRow.name).where(StageResultRow.audit_id == audit_id)).all())
    assert stages == 6  # intake failed, four skipped, verdict
    assert _rows(sessions, mine) == {"submission.received": 1, "audit.stage_completed": stages, "audit.completed": 1}
    assert _rows(sessions, admins) == {"audit.completed": 1}  # admin keys see every submission's events
    assert _rows(sessions, others) == {}  # bob sees nothing of alice's
    with sessions() as s:
        rows = list(s.scalars(select(WebhookDelivery).where(WebhookDelivery.event == "audit.completed")))
    assert len({r.event_id for r in rows}) == 1  # the same webhook-id for every endpoint
    data = rows[0].payload["data"]
    assert rows[0].payload["type"] == "audit.completed"
    assert data["audit_id"] == audit_id and data["verdict"] == "fail" and data["status"] == "failed"
    assert data["caught_by"] == "intake" and data["failed_stages"] == ["intake"]


def test_a_rolled_back_change_leaves_no_event(db) -> None:  # type: ignore[no-untyped-def]
    settings, sessions = db
    with sessions.begin() as s:
        mine = endpoints.create(s, _principal(s, "alice").key_id, "https://hooks.example/a", ["submission.received"]).id
    with pytest.raises(RuntimeError), UnitOfWork(sessions, None) as uow:
        p = _principal(uow.session, "alice")
        sol = example("pytorch_fp32")
        submissions.submit(
            uow,
            settings,
            p,
            problem_name="embedding_backward",
            problem_hash=load_catalogue().get("embedding_backward").content_hash,
            solution_name=sol["name"],
            data=sol,
            idempotency_key=None,
        )
        raise RuntimeError("the request failed after the submission was written")
    assert _rows(sessions, mine) == {}


def test_rank_changes_reach_the_owners_of_the_moved_submissions(db) -> None:  # type: ignore[no-untyped-def]
    settings, sessions = db
    with sessions.begin() as s:
        alices = endpoints.create(
            s, _principal(s, "alice").key_id, "https://hooks.example/a", ["leaderboard.rank_changed"]
        ).id

    def finished(submitter: str, kernel_ms: float) -> str:
        sol = example("pytorch_fp32")
        sol["name"] = f"{submitter}_{kernel_ms}"
        sol["sources"][0]["content"] += (
            f"\n# {sol['name']}\n"  # a kernel of its own: identical sources fold into one entry
        )
        audit_id = _submit(settings, sessions, submitter, sol)
        with sessions.begin() as s:
            repository.claim(s, audit_id, "w", 60)
            repository.store_stage(
                s,
                audit_id,
                "w",
                name="benchmark",
                position=2,
                status="passed",
                summary="",
                metrics={"kernel_median_ms": kernel_ms, "reference_median_ms": 1.0},
                evidence={},
                duration_s=0,
                lease_s=60,
            )
            repository.store_stage(
                s,
                audit_id,
                "w",
                name="verdict",
                position=5,
                status="passed",
                summary="",
                metrics={"passes_benchmark": True, "numerically_sound": True, "caught_by": []},
                evidence={},
                duration_s=0,
                lease_s=60,
            )
            repository.finish(s, audit_id, "w", "passed", "pass", "pass")
            events.audit_completed(s, audit_id)
        return audit_id

    finished("alice", 0.5)
    with sessions() as s:
        first = [
            r.payload["data"] for r in s.scalars(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == alices))
        ]
    assert {(d["board"], d["old_rank"], d["new_rank"]) for d in first} == {
        ("leaderboard", None, 1),
        ("audited", None, 1),
    }
    finished("bob", 0.1)  # faster: alice moves down, and hears about it
    with sessions() as s:
        moved = [
            r.payload["data"] for r in s.scalars(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == alices))
        ]
    assert ("leaderboard", 1, 2) in {(d["board"], d["old_rank"], d["new_rank"]) for d in moved}
    assert all(d["submitter"] == "alice" for d in moved)  # bob's own rank change goes to bob's endpoints, not alice's
