"""Who sees which problem. Catalogue problems are public. An upload is private to its owner (the API key that
uploaded it) and admins until an admin publishes it; a deleted one is seen by nobody (its row stays for the
submissions made against it)."""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from app.auth.principal import Principal
from app.models import Problem
from app.problems.namespaces import (
    MAX_ADDRESS_CHARS,
    SEPARATOR,
    lookupable,
    namespace_of,
    upload_address,
)


def owns(row: Problem, viewer: Principal | None) -> bool:
    return viewer is not None and row.uploaded_by is not None and row.uploaded_by == viewer.key_id


def may_manage(row: Problem, viewer: Principal | None) -> bool:
    """Delete it: its owner or an admin."""
    return viewer is not None and (viewer.is_admin or owns(row, viewer))


def visible(row: Problem, viewer: Principal | None) -> bool:
    if row.deleted_at is not None:
        return False
    return row.public or may_manage(row, viewer)


def listed(viewer: Principal | None) -> ColumnElement[bool]:
    """The same rule as `visible`, as a filter on problems."""
    live = Problem.deleted_at.is_(None)
    if viewer is not None and viewer.is_admin:
        return live
    if viewer is None:
        return and_(live, Problem.public.is_(True))
    return and_(live, or_(Problem.public.is_(True), Problem.uploaded_by == viewer.key_id))


def visible_names(session: Session, viewer: Principal | None) -> list[str]:
    return list(session.scalars(select(Problem.name).where(listed(viewer)).order_by(Problem.name)))


def find(session: Session, viewer: Principal | None, name: str) -> Problem | None:
    """The problem `name` means to this caller: an address it may see (a catalogue name, or `name@namespace`);
    else, for a bare name the catalogue does not have, the caller's own upload of that name. None: nothing."""
    if not lookupable(name):
        return None
    row = session.get(Problem, name)
    if row is not None and visible(row, viewer):
        return row
    if viewer is None or SEPARATOR in name:
        return None
    own = upload_address(name, namespace_of(viewer.key_id))
    if len(own) > MAX_ADDRESS_CHARS:
        return None
    mine = session.get(Problem, own)
    return mine if mine is not None and visible(mine, viewer) else None
