"""Store an uploaded definition as a problem in its uploader's namespace (app.problems.namespaces), keyed by its
content: re-uploading the same documents is a no-op; a different definition under a name the uploader already used
is refused (the leaderboard of an address means one definition). An upload is private until an admin publishes it."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.api.deps import Services
from app.auth.principal import Principal
from app.core.db import utcnow
from app.core.errors import ApiError, FieldError
from app.core.unit_of_work import UnitOfWork
from app.definitions.checks import storage_errors
from app.models import Problem
from app.problems.namespaces import ORIGIN_UPLOADED, namespace_of, upload_address
from worker.formats.bundle import DefinitionBundle

__all__ = ["ORIGIN_UPLOADED", "NameTaken", "store", "store_definition"]


class NameTaken(Exception):
    pass


def store(session: Session, principal: Principal, bundle: DefinitionBundle) -> tuple[Problem, bool]:
    """The stored problem, and whether this call created it (or brought back a deleted one with the same documents)."""
    digest = bundle.content_hash
    name = bundle.definition.name
    namespace = namespace_of(principal.key_id)
    address = upload_address(name, namespace)
    existing = session.get(Problem, address)
    if existing is not None:
        if existing.content_hash != digest:
            why = (
                "a definition you deleted, kept for the submissions made against it"
                if existing.deleted_at is not None
                else "another definition you uploaded"
            )
            raise NameTaken(
                f"'{name}' is already the name of {why} ({address}); give this one another name (definition.name)"
            )
        if existing.deleted_at is None:
            return existing, False
        existing.deleted_at = None  # the same documents again: its own record comes back, private as any upload
        existing.public = False
        session.flush()
        return existing, True
    row = Problem(
        name=address,
        description=bundle.definition.description,
        content_hash=digest,
        definition=bundle.definition.model_dump(mode="json"),
        probes=[],
        synced_at=utcnow(),
        origin=ORIGIN_UPLOADED,
        namespace=namespace,
        public=False,
        bundle=bundle.document(),
        uploaded_by=principal.key_id,
    )
    session.add(row)
    session.flush()
    return row, True


def store_definition(
    uow: UnitOfWork, services: Services, principal: Principal, bundle: DefinitionBundle
) -> tuple[Problem, bool]:
    """The API's way in (POST /v1/definitions, or a definition sent with a submission): the operator's setting, what
    storage needs, then store."""
    if not services.settings.accept_uploaded_definitions:
        raise ApiError(
            403,
            "this deployment audits its curated catalogue only (KAUDIT_ACCEPT_UPLOADED_DEFINITIONS=false)",
            [FieldError(field="definition", reason="uploaded definitions are not accepted here")],
        )
    errors = storage_errors(bundle)
    if errors:
        raise ApiError(422, "invalid definition: it cannot be stored as sent", errors)
    try:
        row, created = store(uow.session, principal, bundle)
    except NameTaken as err:
        raise ApiError(409, str(err), [FieldError(field="definition.name", reason=str(err))]) from err
    services.problems.invalidate()
    return row, created
