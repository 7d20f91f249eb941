"""Store an uploaded definition as a problem, keyed by its content: re-uploading the same documents is a no-op,
a different definition under a name already taken is refused (the leaderboard of a name means one definition)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.auth.principal import Principal
from app.core.db import utcnow
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
                  origin=ORIGIN_UPLOADED, bundle=bundle.model_dump(mode="json", exclude_none=True),
                  uploaded_by=principal.key_id)
    session.add(row)
    session.flush()
    return row, True
