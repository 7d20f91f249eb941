from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class LeaderboardRow(BaseModel):
    rank: int
    submitter: str
    submission_id: str
    solution_name: str
    kernel_ms: float | None
    reference_ms: float | None
    speedup: float | None
    passes_benchmark: bool | None
    numerically_sound: bool | None
    verdict: str | None
    audited_at: datetime | None


class Leaderboard(BaseModel):
    problem: str
    rows: list[LeaderboardRow]
