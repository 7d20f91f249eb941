from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ApiKeyCreate(BaseModel):
    submitter: str = Field(min_length=1, max_length=200)
    scopes: list[Literal["submit", "admin"]] = Field(default_factory=lambda: ["submit"])
    rate_limit: str | None = Field(default=None, max_length=64, pattern=r"^\d{1,9}(/| per )\d{0,6} ?(second|minute|hour|day)s?$",
                                   description="e.g. '60/minute'; default: the server's")


class ApiKeyCreated(BaseModel):
    id: str
    submitter: str
    scopes: list[str]
    key: str = Field(description="shown once; only its hash is stored")
