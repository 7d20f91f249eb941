"""Who is calling: the API key's id, submitter, scopes and rate limit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    key_id: str
    submitter: str
    scopes: frozenset[str]
    rate_limit: str | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes
