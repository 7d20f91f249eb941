"""Storage, leases, the reaper, catalogue sync and the leaderboard, against the real databases (no HTTP, no worker process)."""

from __future__ import annotations

import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, inspect, select
from svc_support import REDIS_URL, bootstrap, example

from app.audits import events, repository
from app.audits.queue import AuditQueue
from app.audits.reaper import reap_once
from app.audits.tasks import run_one
from app.auth.principal import Principal
from app.core.unit_of_work import UnitOfWork
from app.core import migrate
from app.core.db import make_engine, make_sessionmaker, utcnow
from app.core.settings import Settings
from app.jobs.celery import make_celery
from app.jobs.resources import ProcessLocal
from app.leaderboard.service import leaderboard
from app.models import ApiKey, Audit, Base, StageResultRow
from app.problems.service import sync_catalogue
from app.submissions import service as submissions
from worker.catalogue import load_catalogue

TABLES = {
    "problems",
    "api_keys",
    "submissions",
    "audits",
    "stage_results",
    "webhook_endpoints",
    "webhook_deliveries",
    "webhook_attempts",
    "leaderboard_entries",
    "submission_token_stats",
}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migrations_build_the_models_schema_and_go_back_down(backend: str, request: pytest.FixtureRequest) -> None:
    settings: Settings = request.getfixturevalue("sqlite_settings" if backend == "sqlite" else "service_settings")
    migrate.upgrade(settings)
    engine = make_engine(settings)
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) >= TABLES
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
        uniques = {tuple(u["column_names"]) for u in inspect(conn).get_unique_constraints("stage_results")}
        assert ("audit_id", "name") in uniques
    migrate.downgrade(settings, "base")
    with engine.connect() as conn:
        assert not TABLES & set(inspect(conn).get_table_names())
    engine.dispose()


def _submit(settings: Settings, sessions, queue: AuditQueue, n: int = 1, solution: dict | None = None) -> list[str]:  # type: ignore[no-untyped-def, type-arg]
    with UnitOfWork(sessions, queue) as uow:
        key = uow.session.scalar(select(ApiKey).where(ApiKey.submitter == "alice"))
        p = Principal(key.id, key.submitter, frozenset({"submit"}))
        phash = load_catalogue().get("embedding_backward").content_hash
        sol = solution or example("pytorch_fp32")
        ids = [
            submissions.submit(
                uow,
                settings,
                p,
                problem_name="embedding_backward",
                problem_hash=phash,
                solution_name=sol["name"],
                data=sol,
                idempotency_key=None,
            ).audit_id
            for _ in range(n)
        ]
    return ids


@pytest.fixture
def world(service_settings: Settings):  # type: ignore[no-untyped-def]
    bootstrap(service_settings)
    engine = make_engine(service_settings)
    queue = AuditQueue(make_celery(service_settings))
    yield service_settings, make_sessionmaker(engine), queue
    engine.dispose()


def test_reaper_requeues_expired_leases_and_gives_up_after_max_claims(world) -> None:  # type: ignore[no-untyped-def]
    settings, sessions, queue = world
    a, b = _submit(settings, sessions, queue, 2)
    r = redis.Redis.from_url(REDIS_URL)
    r.delete(settings.audit_queue)
    with sessions.begin() as s:
        assert repository.claim(s, a, "dead-1", lease_s=0.2)
        assert repository.claim(s, b, "dead-2", lease_s=0.2)
        s.execute(Audit.__table__.update().where(Audit.id == b).values(claims=settings.max_claims))
    with sessions.begin() as s:
        assert repository.claim(s, a, "other", lease_s=60) is None  # a live lease is not taken
    time.sleep(0.4)
    report = reap_once(sessions, queue, settings)
    assert report.requeued_expired == [a] and report.gave_up == [b]
    with sessions() as s:
        assert s.get(Audit, a).status == "queued" and s.get(Audit, a).lease_owner is None
        lost = s.get(Audit, b)
        assert lost.status == "error" and "lost" in lost.summary
    assert r.llen(settings.audit_queue) == 1  # re-sent after the commit
    assert reap_once(sessions, queue, settings).requeued_expired == []  # idempotent


def test_reaper_times_out_an_audit_past_the_hard_limit(world) -> None:  # type: ignore[no-untyped-def]
    """Celery's hard limit kills the pool process: the expired lease of an audit that has run past the hard
    limit since its first claim ends as timed_out, not requeued (it would only be killed again)."""
    settings, sessions, queue = world
    old, young = _submit(settings, sessions, queue, 2)
    with sessions.begin() as s:
        assert repository.claim(s, old, "killed", lease_s=0.2)
        assert repository.claim(s, young, "killed-too", lease_s=0.2)
        s.execute(
            Audit.__table__.update()
            .where(Audit.id == old)
            .values(started_at=utcnow() - timedelta(seconds=settings.hard_time_limit_s + 1))
        )
    time.sleep(0.4)
    report = reap_once(sessions, queue, settings)
    assert report.timed_out == [old] and report.requeued_expired == [young]
    with sessions() as s:
        a = s.get(Audit, old)
        assert a.status == "timed_out" and a.verdict == "error" and "hard limit" in a.summary
        assert s.get(Audit, young).status == "queued"


def test_reaper_resends_stale_queued_only_when_the_broker_lost_them(world) -> None:  # type: ignore[no-untyped-def]
    settings, sessions, queue = world
    ids = _submit(settings, sessions, queue, 3)
    r = redis.Redis.from_url(REDIS_URL)
    assert r.llen(settings.audit_queue) == 3
    with sessions() as s:  # make them old
        s.execute(
            Audit.__table__.update().values(enqueued_at=utcnow() - timedelta(seconds=settings.requeue_after_s + 5))
        )
        s.commit()
    assert reap_once(sessions, queue, settings).resent_queued == []  # the broker still holds all three
    r.delete(settings.audit_queue)  # the broker loses them (as on a Redis restart)
    assert sorted(reap_once(sessions, queue, settings).resent_queued) == sorted(ids)
    assert r.llen(settings.audit_queue) == 3
    assert reap_once(sessions, queue, settings).resent_queued == []  # just re-sent: not stale any more


def test_a_kernel_that_hangs_ends_the_audit_timed_out_at_once(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The kernel's import outlives the per-call timeout: the audit ends timed_out, blamed on the kernel, and no later stage runs."""
    settings, sessions, queue = world
    hanging = example("pytorch_fp32")
    hanging["sources"][0]["content"] = "import time\ntime.sleep(600)\n" + hanging["sources"][0]["content"]
    (aid,) = _submit(settings, sessions, queue, 1, hanging)
    local = ProcessLocal(
        settings.model_copy(update={"cpu_call_timeout_s": 2, "audit_stages": "intake,static,benchmark"})
    )
    outcome = run_one(local, aid)
    with sessions() as s:
        audit = s.get(Audit, aid)
        assert outcome == "timed_out", audit.summary
        assert audit.status == "timed_out" and audit.verdict == "fail" and audit.lease_owner is None
        assert "did not finish starting or importing" in audit.summary
        rows = {r.name: r for r in s.scalars(select(StageResultRow).where(StageResultRow.audit_id == aid))}
        assert rows["intake"].status == "failed"
        assert {n: rows[n].status for n in ("static", "benchmark", "probes", "canary")} == dict.fromkeys(
            ("static", "benchmark", "probes", "canary"), "skipped"
        )
    local.get().engine.dispose()


def test_catalogue_change_reaudits_every_stored_submission(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings, sessions, queue = world
    ids = _submit(settings, sessions, queue, 2)
    root = tmp_path / "kernels"
    shutil.copytree(load_catalogue().get("embedding_backward").folder, root / "embedding_backward")
    with sessions() as s:
        result, new = sync_catalogue(s, load_catalogue(root), settings)
        assert result.unchanged == ["embedding_backward"] and new == []
    oracle = root / "embedding_backward" / "oracle.py"  # the trusted side of the checks changes
    oracle.write_text(oracle.read_text() + "\n# a changed check\n")
    with sessions() as s:
        result, new = sync_catalogue(s, load_catalogue(root), settings)
        s.commit()
        assert result.changed == ["embedding_backward"] and result.reaudits == 2
        subs = {s.get(Audit, i).submission_id for i in ids}
        assert {a.submission_id for a in new} == subs and all(a.attempt == 2 and a.status == "queued" for a in new)
        assert s.scalar(select(func.count()).select_from(Audit)) == 4


def _finished(sessions, settings, submitter: str, kernel_ms: float | None, passes: bool, sound: bool) -> str:  # type: ignore[no-untyped-def]
    from app.auth.keys import create_api_key

    with UnitOfWork(sessions, _NoBroker()) as uow:  # type: ignore[arg-type]
        s = uow.session
        key = s.scalar(select(ApiKey).where(ApiKey.submitter == submitter))
        if key is None:
            key, _ = create_api_key(s, submitter)
            s.flush()
        p = Principal(key.id, submitter, frozenset({"submit"}))
        data = example("pytorch_fp32")
        data["sources"][0]["content"] += f"\n# {submitter}-{kernel_ms}\n"  # a kernel of its own: identical ones fold
        acc = submissions.submit(
            uow,
            settings,
            p,
            problem_name="embedding_backward",
            problem_hash="h",
            solution_name=f"{submitter}-{kernel_ms}",
            data=data,
            idempotency_key=None,
        )
        assert repository.claim(s, acc.audit_id, "w", 60)
        bench = {"passes_benchmark": passes} | (
            {"kernel_median_ms": kernel_ms, "reference_median_ms": 1.0} if kernel_ms else {}
        )
        repository.store_stage(
            s,
            acc.audit_id,
            "w",
            name="benchmark",
            position=2,
            status="passed" if passes else "failed",
            summary="",
            metrics=bench,
            evidence={},
            duration_s=1,
            lease_s=60,
        )
        repository.store_stage(
            s,
            acc.audit_id,
            "w",
            name="probes",
            position=3,
            status="passed" if sound else "failed",
            summary="",
            metrics={},
            evidence={},
            duration_s=1,
            lease_s=60,
        )
        repository.store_stage(
            s,
            acc.audit_id,
            "w",
            name="verdict",
            position=5,
            status="passed",
            summary="",
            metrics={"passes_benchmark": passes, "numerically_sound": sound},
            evidence={},
            duration_s=0,
            lease_s=60,
        )
        repository.finish(
            s, acc.audit_id, "w", "passed" if passes and sound else "failed", "pass" if passes and sound else "fail", ""
        )
        events.audit_completed(s, acc.audit_id)
        return acc.submission_id


class _NoBroker:
    def send(self, audit_id: str, queue: str) -> bool:
        return True


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_leaderboard_ranks_every_benchmark_passing_kernel_by_speedup(
    request: pytest.FixtureRequest, backend: str
) -> None:
    # the numbers are pulled out of the stages' JSON by the database: both dialects must agree
    settings: Settings = request.getfixturevalue("sqlite_settings" if backend == "sqlite" else "service_settings")
    bootstrap(settings)
    sessions = make_sessionmaker(make_engine(settings))
    fast_unsound = _finished(sessions, settings, "alice", 0.07, passes=True, sound=False)
    _finished(sessions, settings, "alice", 0.20, passes=True, sound=True)
    bob = _finished(sessions, settings, "bob", 0.14, passes=True, sound=True)
    _finished(sessions, settings, "carol", 0.01, passes=False, sound=False)  # fails the benchmark: not ranked
    with sessions() as s:
        lb = leaderboard(s, "embedding_backward")
        assert [(r.rank, r.submitter, r.kernel_ms) for r in lb.rows] == [
            (1, "alice", 0.07),
            (2, "bob", 0.14),
            (3, "alice", 0.20),
        ]
        assert lb.rows[0].submission_id == fast_unsound and lb.rows[0].numerically_sound is False
        assert lb.rows[0].passes_benchmark is True and lb.rows[0].speedup == pytest.approx(1 / 0.07)
        sound = leaderboard(s, "embedding_backward", sound_only=True)
        assert [(r.submitter, r.kernel_ms) for r in sound.rows] == [("bob", 0.14), ("alice", 0.20)]
        assert sound.rows[0].submission_id == bob


def test_celery_delivery_settings() -> None:
    """acks late, reject on worker lost, prefetch 1, soft < hard limit < visibility timeout."""
    s = Settings(
        database_url="sqlite://", redis_url="redis://127.0.0.1:6379/0", soft_time_limit_s=100, hard_time_limit_s=120
    )
    conf = make_celery(s).conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.worker_prefetch_multiplier == 1
    assert (
        conf.task_soft_time_limit
        == 100
        < conf.task_time_limit
        == 120
        < conf.broker_transport_options["visibility_timeout"]
    )
    assert Settings(database_url="sqlite://", device="cuda:0").audit_queue == "gpu"
    assert Settings(database_url="postgres://u@h/db").sqlalchemy_url == "postgresql+psycopg://u@h/db"
