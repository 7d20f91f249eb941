"""Per problem: each submitter's best submission that passes the benchmark, ranked by kernel time.

numerically_sound says whether the probes agree; a fast kernel that the benchmark passes but the
probes fail is shown, marked, not hidden."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from app.leaderboard.schemas import Leaderboard, LeaderboardRow
from app.models import FINISHED, Audit, StageResultRow, Submission

_KERNEL_KEYS = ("kernel_median_ms", "kernel_ms", "solution_ms", "solution_median_ms", "median_ms", "time_ms", "latency_ms", "mean_ms")
_REFERENCE_KEYS = ("reference_ms", "reference_median_ms", "baseline_ms", "ref_ms")


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def find_time(metrics: Mapping[str, Any], keys: tuple[str, ...], depth: int = 0) -> float | None:
    """Tolerant: the first known key at the top level, then inside nested dicts (e.g. metrics['timing'])."""
    for k in keys:
        v = _number(metrics.get(k))
        if v is not None:
            return v
    if depth < 2:
        for v in metrics.values():
            if isinstance(v, Mapping):
                found = find_time(v, keys, depth + 1)
                if found is not None:
                    return found
    return None


def leaderboard(session: Session, problem: str, sound_only: bool = False) -> Leaderboard:
    latest = (select(Audit.submission_id, func.max(Audit.attempt).label("attempt"))
              .join(Submission, Submission.id == Audit.submission_id)
              .where(Submission.problem_name == problem, Audit.status.in_(FINISHED))
              .group_by(Audit.submission_id).subquery())
    rows = session.execute(
        select(Submission.id, Submission.submitter, Submission.solution_name, Audit.id, Audit.verdict, Audit.finished_at,
               StageResultRow.name, StageResultRow.status, StageResultRow.metrics)
        .join(latest, latest.c.submission_id == Submission.id)
        .join(Audit, and_(Audit.submission_id == Submission.id, Audit.attempt == latest.c.attempt))
        .join(StageResultRow, and_(StageResultRow.audit_id == Audit.id, StageResultRow.name.in_(("benchmark", "probes", "verdict"))))
    ).all()
    by_sub: dict[str, dict[str, Any]] = {}
    for sid, submitter, sname, _aid, verdict, finished, stage, sstatus, metrics in rows:
        entry = by_sub.setdefault(sid, dict(submitter=submitter, solution_name=sname, verdict=verdict, audited_at=finished,
                                            bench=None, bench_status=None, probes_status=None, vmetrics={}))
        if stage == "benchmark":
            entry["bench"], entry["bench_status"] = metrics or {}, sstatus
        elif stage == "probes":
            entry["probes_status"] = sstatus
        else:
            entry["vmetrics"] = metrics or {}
    best: dict[str, LeaderboardRow] = {}
    for sid, e in by_sub.items():
        passes = e["vmetrics"].get("passes_benchmark")
        if passes is None and e["bench_status"] is not None:
            passes = e["bench_status"] == "passed"
        # sound only if the probes ran: skipped probes say nothing either way
        sound = None if e["probes_status"] in (None, "skipped") else e["vmetrics"].get("numerically_sound", e["probes_status"] == "passed")
        if passes is not True or (sound_only and sound is not True):
            continue
        bench = e["bench"] or {}
        kernel, ref = find_time(bench, _KERNEL_KEYS), find_time(bench, _REFERENCE_KEYS)
        speedup = _number(bench.get("speedup")) or (ref / kernel if kernel and ref else None)
        row = LeaderboardRow(rank=0, submitter=e["submitter"], submission_id=sid, solution_name=e["solution_name"], kernel_ms=kernel,
                             reference_ms=ref, speedup=speedup, passes_benchmark=passes, numerically_sound=sound,
                             verdict=e["verdict"], audited_at=e["audited_at"])
        cur = best.get(e["submitter"])
        if cur is None or _key(row) < _key(cur):
            best[e["submitter"]] = row
    ranked = sorted(best.values(), key=_key)
    for i, r in enumerate(ranked, start=1):
        r.rank = i
    return Leaderboard(problem=problem, rows=ranked)


def _key(r: LeaderboardRow) -> tuple[float, str]:
    return (r.kernel_ms if r.kernel_ms is not None else math.inf, r.submission_id)
