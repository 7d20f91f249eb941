"""The audit task: claim the audit's lease, run the engine, store each stage as it finishes, finish the row.

Idempotent and lease-guarded: a second delivery of the same message finds the audit claimed or finished and
does nothing; a resumed audit hands the stages already stored to the engine, which does not run them again."""

from __future__ import annotations

import logging
import os
import socket
import uuid

from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded

from app.audits import events, repository, results
from app.audits.lease import Heartbeat
from app.audits.queue import AUDIT_TASK
from app.audits.status import AuditStatus
from app.core.settings import Settings
from app.jobs.resources import ProcessLocal, WorkerResources
from app.models import Problem as ProblemRow
from app.models import StageResultRow, SubmissionTokenStats
from app.problems.namespaces import ORIGIN_UPLOADED
from worker.registry import VERDICT, is_stage, register_extra_stages, stage_order

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another worker owns this audit now; stop without writing anything more."""


def run_one(local: ProcessLocal, audit_id: str) -> str:
    """Claim and run one audit. Returns what happened: 'noop', 'lease-lost', or the final status."""
    res = local.get()
    res.wait_parent_warm()  # before the claim: the audit's lease and budget never include it
    settings = res.settings
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    with res.sessions.begin() as session:
        claim = repository.claim(session, audit_id, owner, settings.lease_s)
        if claim is None:
            return "noop"
        audit, submission, stored = claim.audit, claim.submission, claim.stored

    def finish(status: AuditStatus, verdict: str | None, summary: str) -> str:
        with res.sessions.begin() as s:
            if not repository.finish(s, audit_id, owner, status, verdict, summary):
                return "lease-lost"
            events.audit_completed(s, audit_id)
        return status.value

    hb = Heartbeat(res.sessions, audit_id, owner, settings.lease_s, settings.heartbeat_s)
    try:
        with hb:  # from the claim on: imports and stages can take longer than one lease
            return _run_claimed(
                res,
                audit.id,
                audit.device,
                audit.stages,
                audit.seed,
                submission.problem_name,
                submission.source,
                stored,
                owner,
                hb,
                finish,
                submission.id,
            )
    except LeaseLost:
        log.warning("audit %s: lease lost; another worker owns it now", audit_id)
        return "lease-lost"
    except SoftTimeLimitExceeded:
        return finish(
            AuditStatus.timed_out, "error", f"timed_out: the audit ran past its {settings.soft_time_limit_s} s limit"
        )
    except Exception as err:  # a bug on the trusted side is an error verdict, not an audit stuck in 'running'
        log.exception("audit %s failed inside the worker", audit_id)
        return _finish_after_internal_error(res, audit_id, err, finish)


def _finish_after_internal_error(res: WorkerResources, audit_id: str, err: Exception, finish) -> str:  # type: ignore[no-untyped-def]
    """An internal error ends the audit, but never hides a failure already established (a failed stage outranks an
    error, as in the verdict): an audit with a failed stage finishes failed, whatever broke after it."""
    with res.sessions() as s:
        failed = repository.failed_stages(s, audit_id)
    if isinstance(err, results.StageNotStored) and err.status == "failed" and err.stage not in failed:
        failed.append(err.stage)
    what = results.internal_error_text(err)
    if failed:
        return finish(
            AuditStatus.failed,
            "fail",
            f"fail: caught by {failed[0]}; the audit then stopped on an internal error in the worker: {what}",
        )
    return finish(AuditStatus.error, "error", f"error: internal error in the worker: {what}")


def _run_claimed(
    res: WorkerResources,
    audit_id: str,
    device: str,
    stages: str | None,
    seed: int,
    problem_name: str,
    source: dict,
    stored: dict[str, StageResultRow],
    owner: str,
    hb: Heartbeat,  # type: ignore[type-arg]
    finish,
    submission_id: str,
) -> str:  # type: ignore[no-untyped-def]
    from worker.engine import run_audit
    from worker.formats import Solution
    from worker.probes.token_stats import TokenStatsError
    from worker.stages.result import StageResult, StageStatus

    settings = res.settings
    try:
        problem = res.catalogue.get(problem_name)
    except KeyError as err:
        problem = _uploaded_problem(res, problem_name)
        if problem is None:
            return finish(AuditStatus.error, "error", f"error: {err}")
    try:  # the submission's own token statistics, for this audit and every re-audit
        problem = problem.with_token_stats(load_token_stats(res, submission_id))
    except TokenStatsError as err:  # validated at POST by the same reader: only a changed reader gets here
        return finish(AuditStatus.error, "error", f"error: the submission's token_stats no longer load: {err}")
    # a stage no longer registered (removed since the earlier attempt) is not resumed: this attempt does not run it
    resume = [
        StageResult(
            name=r.name,
            status=StageStatus(r.status),
            summary=r.summary,
            metrics=r.metrics,
            evidence=r.evidence,
            duration_s=r.duration_s,
        )
        for r in stored.values()
        if is_stage(r.name)
    ]
    order = stage_order()

    def store(result: StageResult) -> None:
        record = results.StageRecord(
            name=result.name,
            position=order.index(result.name),
            status=result.status.value,
            summary=result.summary,
            metrics=result.metrics,
            evidence=result.evidence,
            duration_s=result.duration_s,
        )
        ok = results.store(
            res.sessions, audit_id, owner, record, lease_s=settings.lease_s, replace=result.name == VERDICT
        )
        if not ok or hb.lost.is_set():
            raise LeaseLost(audit_id)

    solution = Solution.model_validate(source)
    if solution.definition == problem_name != problem.definition.name:
        # it named the upload by its address ('name@namespace'), which the API resolved: intake compares names
        solution = solution.model_copy(update={"definition": problem.definition.name})
    report = run_audit(
        problem,
        solution,
        device=device,
        stages=stages or settings.audit_stages,
        seed=seed,
        on_stage=store,
        resume=resume,
        budget=settings.audit_budget(device),
        isolation=settings.isolation,
        interrupts=(SoftTimeLimitExceeded,),
        pool=res.sandbox_pool(device),
    )
    return finish(AuditStatus(report.outcome.value), report.verdict.value, report.summary)


def load_token_stats(res: WorkerResources, submission_id: str):  # type: ignore[no-untyped-def]
    """The token statistics sent with the submission, read by the reader that validated them at POST; None: none."""
    from app.submissions.token_stats import source_label
    from worker.probes.token_stats import LoadedTokenStats

    with res.sessions() as s:
        row = s.get(SubmissionTokenStats, submission_id)
        if row is None:
            return None
        data, fmt, kind, key, sha256 = row.data, row.format, row.requested_kind, row.key, row.sha256
    return LoadedTokenStats.from_bytes(data, fmt, kind, key, source=source_label(fmt, sha256))  # type: ignore[arg-type]


def _uploaded_problem(res: WorkerResources, name: str):  # type: ignore[no-untyped-def]
    """A definition uploaded through the API, materialised in this worker's uploads folder; None if there is none."""
    from worker.formats.bundle import DefinitionBundle
    from worker.uploaded import problem_from_bundle

    with res.sessions() as s:
        row = s.get(ProblemRow, name)
        if row is None or row.origin != ORIGIN_UPLOADED or not row.bundle:
            return None
        bundle = DefinitionBundle.model_validate(row.bundle)
    return problem_from_bundle(bundle, res.settings.uploads_dir)


def refuse_unless_isolated(settings: Settings) -> None:
    """At worker start: prove that a submission's sandbox is isolated, or refuse to start (exit 78, EX_CONFIG)."""
    if settings.isolation == "none":
        log.warning("KAUDIT_ISOLATION=none: submissions run UNISOLATED on this worker (every report says so)")
        return
    import json
    import subprocess
    import sys

    # in a process of its own: the Celery parent must not load torch (it forks the pool)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from worker.sandbox.isolation_check import check_isolation; print(check_isolation().model_dump_json())",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        report = json.loads(probe.stdout.strip().splitlines()[-1])
        problems = [str(p) for p in report["problems"]]
    except (ValueError, IndexError, KeyError, TypeError):
        report, problems = (
            {},
            [f"the check did not run (exit {probe.returncode}): {probe.stderr[-500:]} {probe.stdout[-300:]}"],
        )
    if problems:
        log.critical(
            "refusing to start: submissions would not be isolated on this host: %s. Install bubblewrap and "
            "allow user namespaces, or opt out explicitly with KAUDIT_ISOLATION=none.",
            "; ".join(problems),
        )
        logging.shutdown()
        os._exit(78)
    log.info("isolation checked: submissions run as uid %s in their own namespaces", report.get("uid"))


def exit_if_cuda_broken(audit_id: str) -> None:
    """After an audit whose trusted side broke this process's CUDA context (a device-side assert): exit, so that
    the pool starts a fresh process instead of failing every later audit here. The audit is already finished; the
    message's redelivery (acks_late) finds it finished and does nothing."""
    from worker.numerics.cuda_health import cuda_context_broken

    if cuda_context_broken():
        log.critical(
            "audit %s left this worker process's CUDA context unusable; exiting so the pool replaces it", audit_id
        )
        logging.shutdown()
        os._exit(70)  # EX_SOFTWARE


def register(app: Celery, settings: Settings) -> None:
    register_extra_stages(settings.extra_stages)  # torch-free: the parent registers, every pool process inherits it
    local = ProcessLocal(settings)

    @signals.worker_init.connect(weak=False)
    def _check_isolation(sender=None, **_kw) -> None:  # type: ignore[no-untyped-def]
        refuse_unless_isolated(settings)
        # each sandbox child's memory limit is a share of the host per concurrent audit (worker.sandbox.memory);
        # set before the pool forks, so every pool process inherits it
        concurrency = getattr(sender, "concurrency", None)
        if isinstance(concurrency, int) and concurrency > 0:
            os.environ["KAUDIT_CONCURRENT_AUDITS"] = str(concurrency)

    @signals.worker_process_init.connect(weak=False)
    def _preload(**_kw) -> None:  # type: ignore[no-untyped-def]
        """In each pool process (never the parent): import the engine (torch, no CUDA) and open this process's engine."""
        import worker.engine  # noqa: F401

        local.get().catalogue  # noqa: B018
        pool = local.get().sandbox_pool(settings.device)  # this worker's first audit finds a child ready too
        if pool is not None:
            pool.prestart()
        if settings.device.startswith("cuda"):  # a GPU process's first canary training costs seconds (parent_warm)
            local.get().start_parent_warm(settings.device)

    @app.task(name=AUDIT_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def audit_task(audit_id: str) -> str:
        outcome = run_one(local, audit_id)
        log.info("audit %s: %s", audit_id, outcome)
        exit_if_cuda_broken(audit_id)
        return outcome
