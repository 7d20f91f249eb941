from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class ProblemSummary(BaseModel):
    name: str = Field(
        description="the problem's address, what a solution's `definition` and URLs name: a catalogue "
        "problem's definition name, or an upload's '<definition name>@<namespace>'"
    )
    description: str
    content_hash: str
    inputs: list[str]
    outputs: list[str]
    probes: list[str]
    origin: str = Field(default="catalogue", description="catalogue (curated, under kernels/) or uploaded")
    namespace: str = Field(default="catalogue", description="catalogue, or the uploading API key's namespace")
    public: bool = Field(
        default=True, description="false: an upload only its owner and admins see, until an admin publishes it"
    )


class ProblemDetail(ProblemSummary):
    definition: dict[str, Any]
    synced_at: datetime


class SyncResult(BaseModel):
    added: list[str]
    changed: list[str]
    unchanged: list[str]
    reaudits: int


class DatasetImport(BaseModel):
    path: str = Field(
        min_length=1, max_length=4096, description="absolute path of a SOL-ExecBench dataset tree on the server"
    )


class DatasetImported(BaseModel):
    report: dict[str, Any] = Field(
        description="imported problems and refused folders (worker.dataset_import.ImportReport)"
    )
    sync: SyncResult | None = Field(
        None, description="the catalogue sync that followed; null when nothing was imported"
    )
