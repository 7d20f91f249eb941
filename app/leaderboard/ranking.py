"""The one ranking. GET /v1/leaderboard, the dashboard's boards and the leaderboard.rank_changed webhooks all show
ranks this function computed: app.leaderboard.repository calls `rank_boards` when an audit finishes and stores its
entries, and every reader reads those.

Rules, as implemented:
  - One board per problem and hardware (`cpu`, or the GPU's name): times from different devices are not compared.
  - A run (a submission's latest finished audit) enters only if its audit passed or failed (never `error` or
    `timed_out`: inconclusive), its benchmark passed, and it has a speedup.
  - Identical kernels are one entry: runs whose sources, entry point and languages hash the same
    (app.leaderboard.identity) are folded together, credited to the earliest submission. The entry shows how many
    runs it holds, the median of their speedups, and an interval covering every run's interval.
  - Rank by speedup, higher first: it is comparable across problems and robust to the host's speed. Order within
    equal speedups: the higher low end of the interval, then the earlier submission.
  - Two boards in that order. `benchmark`: every entry; a kernel an audit stage caught stays, marked. `audited`:
    verified entries only, those whose runs all passed every stage (verdict `pass`; a kernel caught once is not
    verified, however often it passed).
  - Ties: dense ranking by interval overlap. Walking the board in order, an entry shares the rank of the group
    above it when its interval overlaps the interval of that group's first (fastest) entry; otherwise it takes the
    next rank (1, 1, 2, 3, 3, ...). Comparing with the group's first entry, not the previous one, keeps a chain of
    small overlaps from tying the fastest kernel with the slowest.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from worker.report import StageStatus, worst_status

Board = Literal["benchmark", "audited"]
BOARDS: tuple[Board, ...] = ("benchmark", "audited")
RANKED_STATUSES = ("passed", "failed")


class Run(BaseModel):
    """One submission's latest finished audit, as the ranking reads it."""

    submission_id: str
    submitter: str
    solution_name: str
    submitted_at: datetime
    finished_at: datetime | None = None
    kernel_hash: str
    hardware: str
    status: str
    verdict: str | None
    passes_benchmark: bool | None
    numerically_sound: bool | None = None
    caught_by: str | None = None
    kernel_ms: float | None = None
    reference_ms: float | None = None
    speedup: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    indicative: bool = False
    stages: dict[str, StageStatus] = Field(default_factory=dict, description="each stage's status, the verdict's aside")

    @property
    def ranked(self) -> bool:
        return (
            self.status in RANKED_STATUSES
            and self.passes_benchmark is True
            and self.speedup is not None
            and self.speedup > 0
        )

    @property
    def interval(self) -> tuple[float, float]:
        """The run's interval; a run timed before intervals were recorded is its point."""
        assert self.speedup is not None
        lo = self.speedup_lo if self.speedup_lo is not None else self.speedup
        hi = self.speedup_hi if self.speedup_hi is not None else self.speedup
        return min(lo, self.speedup), max(hi, self.speedup)


class Entry(BaseModel):
    """One kernel on one board: its runs folded together."""

    hardware: str
    kernel_hash: str
    submission_id: str = Field(description="the earliest submission of the kernel: the entry's credit and link")
    submitter: str
    solution_name: str
    submitted_at: datetime
    submission_ids: list[str] = Field(description="every run folded into the entry, earliest first")
    runs: int
    speedup: float = Field(description="median of the runs' speedups")
    speedup_lo: float = Field(description="low end of the interval covering every run's interval")
    speedup_hi: float
    kernel_ms: float | None
    reference_ms: float | None
    verdict: str = Field(description="pass when every run passed, else fail (a run an audit stage caught)")
    caught_by: str | None
    numerically_sound: bool | None = Field(description="false if any run's probes failed; null if none ran")
    indicative: bool = Field(description="some run's figures are only indicative (timed on the CPU)")
    audited_at: datetime | None = Field(description="the latest run's finish")
    stages: dict[str, StageStatus] = Field(description="each stage's worst status over the runs")
    rank: int = 0
    tied: bool = False
    position: int = 0


def _median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(statistics.median(vals)) if vals else None


def _stages(runs: list[Run]) -> dict[str, StageStatus]:
    """Each stage's worst status over the runs (failed, error, passed, skipped): a stage that caught one run caught the
    kernel, as the entry's verdict says."""
    names = dict.fromkeys(name for r in runs for name in r.stages)
    return {name: worst_status(r.stages[name] for r in runs if name in r.stages) for name in names}


def _entry(hardware: str, kernel_hash: str, runs: list[Run]) -> Entry:
    runs = sorted(runs, key=lambda r: (r.submitted_at, r.submission_id))
    first = runs[0]
    sound = [r.numerically_sound for r in runs if r.numerically_sound is not None]
    caught = [r for r in runs if r.status != "passed"]  # ranked runs passed or failed: a failed one was caught
    finished = [r.finished_at for r in runs if r.finished_at is not None]
    speedup = _median(r.speedup for r in runs)
    assert speedup is not None
    return Entry(
        hardware=hardware,
        kernel_hash=kernel_hash,
        submission_id=first.submission_id,
        submitter=first.submitter,
        solution_name=first.solution_name,
        submitted_at=first.submitted_at,
        submission_ids=[r.submission_id for r in runs],
        runs=len(runs),
        speedup=speedup,
        speedup_lo=min(r.interval[0] for r in runs),
        speedup_hi=max(r.interval[1] for r in runs),
        kernel_ms=_median(r.kernel_ms for r in runs),
        reference_ms=_median(r.reference_ms for r in runs),
        verdict="fail" if caught else "pass",
        caught_by=next((r.caught_by for r in caught if r.caught_by), None),
        numerically_sound=(all(sound) if sound else None),
        indicative=any(r.indicative for r in runs),
        audited_at=max(finished) if finished else None,
        stages=_stages(runs),
    )


def overlaps(a: Entry, b: Entry) -> bool:
    return a.speedup_lo <= b.speedup_hi and b.speedup_lo <= a.speedup_hi


def _ranked(entries: list[Entry]) -> list[Entry]:
    """`entries` of one board in order, with dense ranks by interval overlap (see the module's docstring)."""
    order = sorted(entries, key=lambda e: (-e.speedup, -e.speedup_lo, e.submitted_at, e.submission_id))
    out: list[Entry] = []
    leader: Entry | None = None
    rank = 0
    for position, e in enumerate(order, start=1):
        if leader is None or not overlaps(leader, e):
            rank, leader = rank + 1, e
        out.append(e.model_copy(update={"rank": rank, "position": position}))
    counts: dict[int, int] = {}
    for e in out:
        counts[e.rank] = counts.get(e.rank, 0) + 1
    return [e.model_copy(update={"tied": counts[e.rank] > 1}) for e in out]


def rank_boards(runs: Iterable[Run]) -> dict[tuple[Board, str], list[Entry]]:
    """Every board of one problem, keyed by (board, hardware), each in rank order."""
    folded: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        if r.ranked:
            folded.setdefault((r.hardware, r.kernel_hash), []).append(r)
    entries = [_entry(hw, kh, rs) for (hw, kh), rs in folded.items()]
    boards: dict[tuple[Board, str], list[Entry]] = {}
    for hardware in sorted({e.hardware for e in entries}):
        on = [e for e in entries if e.hardware == hardware]
        boards[("benchmark", hardware)] = _ranked(on)
        verified = [e for e in on if e.verdict == "pass"]
        if verified:
            boards[("audited", hardware)] = _ranked(verified)
    return boards
