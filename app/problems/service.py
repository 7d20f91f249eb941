"""The problems table: the catalogue mirrored into it (a changed problem re-audits every stored submission of it),
and uploads published, unpublished or deleted."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.audits import events
from app.audits import repository as audits
from app.audits.status import AuditStatus
from app.auth.principal import Principal
from app.core.db import utcnow
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.models import Audit, Problem, Submission
from app.problems.access import listed
from app.problems.namespaces import CATALOGUE, ORIGIN_CATALOGUE
from app.problems.schemas import ProblemDetail, ProblemSummary, SyncResult


class NamespaceConflict(RuntimeError):
    """A row that is not the catalogue's holds a catalogue address (only a database not migrated to 0007 has one)."""


class ProblemBusy(Exception):
    """Audits of the problem are queued or running."""

    def __init__(self, active: int) -> None:
        super().__init__(f"{active} audit(s) of this problem are queued or running; delete it once they have finished")
        self.active = active


def sync_catalogue(session: Session, catalogue, settings: Settings) -> tuple[SyncResult, list[Audit]]:  # type: ignore[no-untyped-def]
    """Upsert every catalogue problem; returns the result and the new audits (commit, then enqueue them).
    The catalogue's own definition is always what its name holds: uploads live at addresses it cannot have."""
    added, changed, unchanged, new_audits = [], [], [], []
    for p in catalogue:
        row = session.get(Problem, p.name)
        definition = p.definition.model_dump(mode="json")
        probes = [s.name for s in p.spec.probes]
        if row is not None and (row.origin != ORIGIN_CATALOGUE or row.namespace != CATALOGUE):
            raise NamespaceConflict(
                f"problem '{p.name}' is held by an upload; run the migrations (alembic upgrade head)"
            )
        if row is None:
            session.add(
                Problem(
                    name=p.name,
                    description=p.definition.description or "",
                    content_hash=p.content_hash,
                    definition=definition,
                    probes=probes,
                    synced_at=utcnow(),
                    origin=ORIGIN_CATALOGUE,
                    namespace=CATALOGUE,
                    public=True,
                )
            )
            added.append(p.name)
            continue
        if row.content_hash == p.content_hash:
            unchanged.append(p.name)
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
    audit = audits.new_audit(
        session,
        sub,
        problem_hash=problem_hash,
        attempt=audits.next_attempt(session, sub.id),
        reason=reason,
        stages=settings.audit_stages,
        device=device,
        queue=settings.queue_for(device),
    )
    session.flush()
    events.reaudited(session, sub, audit)
    return audit


def _summary(row: Problem) -> dict[str, object]:
    return dict(
        name=row.name,
        description=row.description,
        content_hash=row.content_hash,
        inputs=list(row.definition.get("inputs", {})),
        outputs=list(row.definition.get("outputs", {})),
        probes=row.probes,
        origin=row.origin,
        namespace=row.namespace,
        public=row.public,
    )


def list_problems(session: Session, viewer: Principal | None = None) -> list[ProblemSummary]:
    """The problems this caller may see: public ones, its own uploads, and (an admin) every upload."""
    return [
        ProblemSummary(**_summary(r))
        for r in session.scalars(select(Problem).where(listed(viewer)).order_by(Problem.name))
    ]


def detail(row: Problem) -> ProblemDetail:
    return ProblemDetail(**_summary(row), definition=row.definition, synced_at=row.synced_at)


def active_audits(session: Session, name: str) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(Audit)
            .join(Submission, Submission.id == Audit.submission_id)
            .where(Submission.problem_name == name, Audit.status.in_((AuditStatus.queued, AuditStatus.running)))
        )
        or 0
    )


def delete_upload(session: Session, row: Problem) -> Literal["removed", "retired"]:
    """Delete an uploaded problem. Refused (ProblemBusy) while audits of it are queued or running. Its submissions and
    their results are kept: with submissions, the row stays as their record ('retired': seen by nobody and never
    audited against again; its address takes back only the same documents); without any, it is removed and its
    address is free again."""
    active = active_audits(session, row.name)
    if active:
        raise ProblemBusy(active)
    if session.scalar(select(func.count()).select_from(Submission).where(Submission.problem_name == row.name)):
        row.deleted_at, row.public = utcnow(), False
        session.flush()
        return "retired"
    session.delete(row)
    session.flush()
    return "removed"


def sync_and_enqueue(uow: UnitOfWork, settings: Settings) -> SyncResult:
    """Load the catalogue from disk into the problems table; the re-audits go out once `uow` commits."""
    from worker.catalogue import DEFAULT_ROOT, load_catalogue

    result, new_audits = sync_catalogue(uow.session, load_catalogue(settings.catalogue_root or DEFAULT_ROOT), settings)
    uow.enqueue(*new_audits)
    return result
