from __future__ import annotations

from pydantic import BaseModel, Field


class DefinitionStored(BaseModel):
    name: str
    content_hash: str = Field(description="sha256 of the definition and its workloads: the same documents, the same hash")
    origin: str = Field(description="'catalogue' (curated, under kernels/) or 'uploaded'")
    created: bool = Field(description="false when this exact definition was already known")
    problem_url: str
