from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class ProblemSummary(BaseModel):
    name: str
    description: str
    content_hash: str
    inputs: list[str]
    outputs: list[str]
    probes: list[str]


class ProblemDetail(ProblemSummary):
    definition: dict[str, Any]
    synced_at: datetime


class SyncResult(BaseModel):
    added: list[str]
    changed: list[str]
    unchanged: list[str]
    reaudits: int
