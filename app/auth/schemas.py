from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, field_validator


class ApiKeyCreate(BaseModel):
    submitter: str = Field(
        min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$", description="no control characters"
    )
    scopes: list[Literal["submit", "admin"]] = Field(default_factory=lambda: ["submit"])
    rate_limit: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^\d{1,9}(/| per )\d{0,6} ?(second|minute|hour|day)s?$",
        description="e.g. '60/minute'; default: the server's",
    )

    @field_validator("rate_limit")
    @classmethod
    def _parses(cls, v: str | None) -> str | None:
        if v is not None:
            from limits import parse

            try:
                item = parse(v)
            except ValueError as err:
                raise ValueError(f"not a rate limit: {err}") from err
            if item.amount < 1 or item.multiples < 1:
                raise ValueError("amount and period must be at least 1")
        return v


class ApiKeyCreated(BaseModel):
    id: str
    submitter: str
    scopes: list[str]
    key: str = Field(description="shown once; only its hash is stored")


class ApiKeyOut(BaseModel):
    id: str
    submitter: str
    prefix: str = Field(
        description="the key's first characters, to tell keys apart; the key itself is never shown again"
    )
    scopes: list[str]
    rate_limit: str | None
    created_at: datetime
    revoked_at: datetime | None
