"""Where an audit a benchmark run cut short had got to: its stages' progress, kept in a file as it goes.

An audit the run's time budget stops, or whose process dies, returns nothing; without this, the run's record of it
is only its name. Each audit appends JSON lines to its own file: the engine's progress notes ("probes: scale_0.01:x")
and every finished stage with its duration. `summary` reads such a file back into what the run reports of an
unfinished audit: the stages that finished, how long each took, and the last note with its time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from worker.report import StageResult


class FinishedStage(BaseModel):
    stage: str
    status: str
    duration_s: float
    timings: dict[str, Any] | None = None


class Progress(BaseModel):
    """What an unfinished audit's file says."""

    finished: list[FinishedStage] = Field(default_factory=list)
    last_note: str | None = Field(None, description="the engine's last progress note")
    last_note_at_s: float | None = Field(None, description="seconds into the audit when it was written")
    elapsed_s: float | None = Field(None, description="seconds into the audit of the file's last line")

    def describe(self) -> str:
        done = ", ".join(f"{s.stage} {s.status} in {s.duration_s:.1f} s" for s in self.finished) or "no stage finished"
        last = f"; last: '{self.last_note}' at {self.last_note_at_s:.1f} s" if self.last_note is not None else ""
        return done + last


class ProgressLog:
    """Appends an audit's progress to `path` (one JSON object a line), each line flushed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.t0 = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def _append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"t": round(time.monotonic() - self.t0, 2), **record}) + "\n")

    def note(self, message: str) -> None:
        self._append({"note": message})

    def stage(self, result: StageResult) -> None:
        timings = result.metrics.get("timings")
        self._append(
            {
                "stage": result.name,
                "status": result.status.value,
                "duration_s": round(result.duration_s, 2),
                "timings": timings if isinstance(timings, dict) else None,
            }
        )


def summary(path: Path) -> Progress:
    """The file's progress; an empty Progress where the audit never started (no file) or wrote nothing."""
    progress = Progress()
    if not path.exists():
        return progress
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the process died mid-line
            continue
        progress.elapsed_s = record.get("t")
        if "stage" in record:
            progress.finished.append(FinishedStage.model_validate(record))
        elif "note" in record:
            progress.last_note, progress.last_note_at_s = record["note"], record.get("t")
    return progress
