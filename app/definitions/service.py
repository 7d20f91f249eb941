"""Store an uploaded definition as a problem, keyed by its content: re-uploading the same documents is a no-op,
a different definition under a name already taken is refused (the leaderboard of a name means one definition)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.api.deps import Services
from app.auth.principal import Principal
from app.core.db import utcnow
from app.core.errors import ApiError, FieldError
from app.core.unit_of_work import UnitOfWork
from app.models import Problem
from worker.formats.bundle import DefinitionBundle

ORIGIN_UPLOADED = "uploaded"


class NameTaken(Exception):
    pass


def store(session: Session, principal: Principal, bundle: DefinitionBundle) -> tuple[Problem, bool]:
    """The stored problem, and whether this call created it."""
    digest = bundle.content_hash
    name = bundle.definition.name
    existing = session.get(Problem, name)
    if existing is not None:
        if existing.origin == ORIGIN_UPLOADED and existing.content_hash == digest:
            return existing, False
        kind = "curated catalogue" if existing.origin != ORIGIN_UPLOADED else "uploaded definitions"
        raise NameTaken(f"a different definition named '{name}' is already in the {kind}; "
                        "give yours another name (definition.name)")
    row = Problem(name=name, description=bundle.definition.description, content_hash=digest,
                  definition=bundle.definition.model_dump(mode="json"), probes=[], synced_at=utcnow(),
                  origin=ORIGIN_UPLOADED, bundle=bundle.document(),
                  uploaded_by=principal.key_id)
    session.add(row)
    session.flush()
    return row, True


def store_definition(uow: UnitOfWork, services: Services, principal: Principal, bundle: DefinitionBundle) -> tuple[Problem, bool]:
    """The API's way in (POST /v1/definitions, or a definition sent with a submission): the operator's setting, then store."""
    if not services.settings.accept_uploaded_definitions:
        raise ApiError(403, "this deployment audits its curated catalogue only (KAUDIT_ACCEPT_UPLOADED_DEFINITIONS=false)",
                       [FieldError(field="definition", reason="uploaded definitions are not accepted here")])
    try:
        row, created = store(uow.session, principal, bundle)
    except NameTaken as err:
        raise ApiError(409, str(err), [FieldError(field="definition.name", reason=str(err))]) from err
    services.problems.invalidate()
    return row, created
