"""The problems table mirrors the catalogue; a changed problem re-audits every stored submission of it."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.audits import events
from app.audits import repository as audits
from app.core.db import utcnow
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.models import Audit, Problem, Submission
from app.problems.schemas import ProblemDetail, ProblemSummary, SyncResult


def sync_catalogue(session: Session, catalogue, settings: Settings) -> tuple[SyncResult, list[Audit]]:  # type: ignore[no-untyped-def]
    """Upsert every catalogue problem; returns the result and the new audits (commit, then enqueue them)."""
    added, changed, unchanged, new_audits = [], [], [], []
    for p in catalogue:
        row = session.get(Problem, p.name)
        definition = p.definition.model_dump(mode="json")
        probes = [s.name for s in p.spec.probes]
        if row is None:
            session.add(Problem(name=p.name, description=p.definition.description or "", content_hash=p.content_hash,
                                definition=definition, probes=probes, synced_at=utcnow()))
            added.append(p.name)
            continue
        if row.content_hash == p.content_hash or row.origin != "catalogue":
            unchanged.append(p.name)  # an uploaded definition keeps its name: the catalogue cannot take it over
            continue
        row.content_hash, row.definition, row.probes, row.synced_at = p.content_hash, definition, probes, utcnow()
        row.description = p.definition.description or ""
        changed.append(p.name)
        for sub in session.scalars(select(Submission).where(Submission.problem_name == p.name)):
            new_audits.append(reaudit(session, sub, p.content_hash, settings, reason="problem checks changed"))
    session.flush()
    return SyncResult(added=added, changed=changed, unchanged=unchanged, reaudits=len(new_audits)), new_audits


def reaudit(session: Session, sub: Submission, problem_hash: str, settings: Settings, reason: str) -> Audit:
    # the device the submission was routed to at intake, not the device of whoever asks for the re-audit
    last = audits.latest_audit(session, sub.id)
    device = last.device if last is not None else settings.device
    audit = audits.new_audit(session, sub, problem_hash=problem_hash, attempt=audits.next_attempt(session, sub.id), reason=reason,
                             stages=settings.audit_stages, device=device, queue=settings.queue_for(device))
    session.flush()
    events.reaudited(session, sub, audit)
    return audit


def _summary(row: Problem) -> dict[str, object]:
    return dict(name=row.name, description=row.description, content_hash=row.content_hash,
                inputs=list(row.definition.get("inputs", {})), outputs=list(row.definition.get("outputs", {})), probes=row.probes)


def list_problems(session: Session) -> list[ProblemSummary]:
    return [ProblemSummary(**_summary(r)) for r in session.scalars(select(Problem).order_by(Problem.name))]


def get_problem(session: Session, name: str) -> ProblemDetail | None:
    row = session.get(Problem, name)
    return None if row is None else ProblemDetail(**_summary(row), definition=row.definition, synced_at=row.synced_at)


def sync_and_enqueue(uow: UnitOfWork, settings: Settings) -> SyncResult:
    """Load the catalogue from disk into the problems table; the re-audits go out once `uow` commits."""
    from worker.catalogue import DEFAULT_ROOT, load_catalogue

    result, new_audits = sync_catalogue(uow.session, load_catalogue(settings.catalogue_root or DEFAULT_ROOT), settings)
    uow.enqueue(*new_audits)
    return result
