from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from worker.report import StageStatus


class LeaderboardRow(BaseModel):
    """One entry of a board (app.leaderboard.ranking): a kernel on one hardware, its identical runs folded in."""

    rank: int = Field(description="dense rank by interval overlap: entries whose speedup intervals overlap share one")
    tied: bool = Field(False, description="another entry shares this rank")
    hardware: str = Field("", description="the board: cpu, or the GPU's name")
    submitter: str
    submission_id: str = Field(description="the kernel's earliest submission")
    solution_name: str
    kernel_ms: float | None = Field(description="median over the runs")
    reference_ms: float | None
    speedup: float | None = Field(description="median of the runs' speedups (reference time / kernel time)")
    speedup_ci: list[float] | None = Field(None, description="[lo, hi]: covers every run's 95% interval")
    runs: int = Field(1, description="identical runs (same sources, entry point, languages) folded into this entry")
    submission_ids: list[str] = Field(default_factory=list, description="every folded run, earliest first")
    passes_benchmark: bool | None
    numerically_sound: bool | None
    verdict: str | None = Field(description="pass: every run passed every stage; fail: an audit stage caught a run")
    caught_by: str | None = None
    indicative: bool = Field(False, description="CPU figures: round trips through the sandbox, indicative only")
    audited_at: datetime | None
    stages: dict[str, StageStatus] = Field(
        default_factory=dict,
        description="every stage's status but the verdict's, in the order the stages ran (any "
        "stage registered in worker.registry); over folded runs, each stage's worst "
        "(failed, error, passed, skipped)",
    )


class Leaderboard(BaseModel):
    problem: str
    rows: list[LeaderboardRow]
