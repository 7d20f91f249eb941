"""Who sees what of a submission: the one rule, used by the API's submission routes and by the dashboard.

Public, to anyone who may read the leaderboard: the verdict, the audit's and each stage's status, durations, the
numbers the stages measured, the plots drawn from them and the auditor's own diagnoses of those numbers.

Private, to the key that submitted it and to admins only: everything the submission itself produced or the audit
quoted from it. Stage summaries quote the submission's exceptions ("the solution does not import: ..."), evidence
holds tracebacks with source lines and host paths and the submission's printed output, and the audit summary
repeats the failing stage's summary. None of that text is safe to show to another tenant, so the public view keeps
no text of a stage's record but the diagnoses, and no number whose key names a seed (derived seeds would let a
submitter recognise an audit's inputs)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from app.auth.principal import Principal


class Disclosure(StrEnum):
    full = "full"  # the owner's key or an admin: everything
    public = "public"  # anyone else: statuses and numbers


def disclosure(viewer: Principal | None, owner_key_id: str | None) -> Disclosure:
    if viewer is not None and (viewer.is_admin or (owner_key_id is not None and viewer.key_id == owner_key_id)):
        return Disclosure.full
    return Disclosure.public


def _secret_key(key: object) -> bool:
    return "seed" in str(key).lower()


def public_numbers(value: Any) -> Any:
    """Only the numbers of a stored metrics record (and its structure): strings are dropped, as are numbers under
    a key naming a seed. None where nothing numeric is left."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, dict):
        kept = {str(k): public_numbers(v) for k, v in value.items() if not _secret_key(k)}
        kept = {k: v for k, v in kept.items() if v is not None}
        return kept or None
    if isinstance(value, list):
        items = [public_numbers(v) for v in value]
        items = [v for v in items if v is not None]
        return items or None
    return None


def public_audit_summary(verdict: str | None, stages: Iterable[tuple[str, str]]) -> str | None:
    """The audit's one line without quoting the submission: the verdict and the stages that did not pass."""
    if verdict is None:
        return None
    not_passed = [f"{name} {status}" for name, status in stages if status not in ("passed", "skipped")]
    return f"{verdict}: " + (", ".join(not_passed) if not_passed else "every stage passed")
