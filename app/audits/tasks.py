"""The audit task: idempotent, lease-guarded, writes each stage result as it finishes."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded

from app.audits import repository
from app.audits.lease import Heartbeat
from app.audits.queue import AUDIT_TASK
from app.core.settings import Settings
from app.jobs.resources import ProcessLocal

log = logging.getLogger(__name__)

_VERDICT_STATUS = {"pass": "passed", "fail": "failed", "error": "error"}


class LeaseLost(Exception):
    """Another worker owns this audit now; stop without writing anything more."""


class AuditTimedOut(Exception):
    pass


def run_one(local: ProcessLocal, audit_id: str) -> str:
    """Claim and run one audit. Returns what happened: 'noop', 'lease-lost', or the final status."""
    res = local.get()
    settings = res.settings
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    with res.sessions() as session:
        claim = repository.claim(session, audit_id, owner, settings.lease_s)
        if claim is None:
            return "noop"
        audit, submission, stored = claim.audit, claim.submission, claim.stored
    deadline = time.monotonic() + settings.soft_time_limit_s

    def store(result, replace: bool = False) -> None:  # type: ignore[no-untyped-def]
        from worker.engine import DEFAULT_STAGES

        order = [*DEFAULT_STAGES, "verdict"]
        with res.sessions() as s:
            ok = repository.store_stage(
                s, audit_id, owner, name=result.name, position=order.index(result.name) if result.name in order else len(order),
                status=result.status.value, summary=result.summary, metrics=result.metrics, evidence=result.evidence,
                duration_s=result.duration_s, lease_s=settings.lease_s, replace=replace)
        if not ok:
            raise LeaseLost(audit_id)

    def finish(status: str, verdict: str | None, summary: str) -> str:
        with res.sessions() as s:
            if not repository.finish(s, audit_id, owner, status, verdict, summary):
                return "lease-lost"
        return status

    hb = Heartbeat(res.sessions, audit_id, owner, settings.lease_s, settings.heartbeat_s)
    try:
        with hb:  # from the claim on: imports and stages can take longer than one lease
            return _run_claimed(res, audit, submission, stored, hb, store, finish, deadline)
    except LeaseLost:
        log.warning("audit %s: lease lost; another worker owns it now", audit_id)
        return "lease-lost"
    except (AuditTimedOut, SoftTimeLimitExceeded):
        return finish("timed_out", "error", f"timed_out: the audit ran past its {settings.soft_time_limit_s} s limit")
    except Exception as err:  # a bug on the trusted side is an error verdict, not an audit stuck in 'running'
        log.exception("audit %s failed inside the worker", audit_id)
        return finish("error", "error", f"error: internal error in the worker: {type(err).__name__}: {err}")


def _run_claimed(res, audit, submission, stored, hb, store, finish, deadline) -> str:  # type: ignore[no-untyped-def]
    settings, audit_id = res.settings, audit.id
    from worker.formats import Solution
    from worker.stages.result import StageResult, StageStatus

    try:
        problem = res.catalogue.get(submission.problem_name)
    except KeyError as err:
        return finish("error", "error", f"error: {err}")
    solution = Solution.model_validate(submission.source)
    stored_results = [StageResult(name=r.name, status=StageStatus(r.status), summary=r.summary, metrics=r.metrics,
                                  evidence=r.evidence, duration_s=r.duration_s) for r in stored.values() if r.name != "verdict"]
    results = {r.name: r for r in stored_results}

    def on_stage(result: StageResult) -> None:
        if result.name == "verdict":
            return  # judged below over every stored stage, including those of an earlier attempt
        store(result)
        results[result.name] = result
        if hb.lost.is_set():
            raise LeaseLost(audit_id)
        if time.monotonic() > deadline:
            raise AuditTimedOut(audit_id)

    intake = results.get("intake")
    if intake is None or intake.status is StageStatus.passed:
        from worker.engine import run_audit

        run_audit(problem, solution, device=audit.device, stages=audit.stages or settings.audit_stages,
                  seed=audit.seed, on_stage=on_stage, skip=list(results), interrupts=(SoftTimeLimitExceeded,))
    else:  # resumed after intake failed: the rest never runs
        from worker.engine import DEFAULT_STAGES

        for name in DEFAULT_STAGES:
            if name not in results:
                on_stage(StageResult(name=name, status=StageStatus.skipped, summary="intake did not pass"))
    from worker.engine import DEFAULT_STAGES
    from worker.stages import verdict as verdict_stage
    from worker.stages.result import AuditReport

    ordered = [results[n] for n in DEFAULT_STAGES if n in results]
    final = verdict_stage.judge(ordered)
    store(final, replace=True)
    verdict = AuditReport.verdict_of(ordered).value
    return finish(_VERDICT_STATUS[verdict], verdict, final.summary)


def register(app: Celery, settings: Settings) -> None:
    local = ProcessLocal(settings)

    @signals.worker_process_init.connect(weak=False)
    def _preload(**_kw) -> None:  # type: ignore[no-untyped-def]
        """In each pool process (never the parent): import the engine (torch, no CUDA) and open this process's engine."""
        import worker.engine  # noqa: F401

        local.get().catalogue  # noqa: B018

    @app.task(name=AUDIT_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def audit_task(audit_id: str) -> str:
        outcome = run_one(local, audit_id)
        log.info("audit %s: %s", audit_id, outcome)
        return outcome
