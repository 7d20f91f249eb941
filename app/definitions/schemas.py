from __future__ import annotations

from pydantic import BaseModel, Field


class DefinitionStored(BaseModel):
    name: str = Field(
        description="the problem's address, '<definition name>@<namespace>': a solution names it in "
        "`definition` (its bare definition name works too, for you, where the catalogue has "
        "no problem of that name)"
    )
    definition_name: str = Field(description="the name in definition.json")
    namespace: str = Field(
        description="your API key's namespace: uploads never share a name with the catalogue or "
        "with another key's uploads"
    )
    content_hash: str = Field(
        description="sha256 of the definition and its workloads: the same documents, the same hash"
    )
    origin: str = Field(description="'catalogue' (curated, under kernels/) or 'uploaded'")
    public: bool = Field(description="false until an admin publishes it: only you and admins see it")
    created: bool = Field(description="false when this exact definition was already known")
    problem_url: str
