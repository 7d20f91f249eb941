"""One ranking everywhere (app.leaderboard.ranking): the API over real HTTP, the dashboard's page and query, and the
rank-change webhooks agree on every rank of a seeded problem with duplicates, errors, a timed-out audit and two
hardware boards; by speedup, verified kernels only on the audited board, identical kernels folded, ties by overlap."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from svc_support import bootstrap, bootstrap_at, example, start_api

from app.audits import events, repository
from app.auth.keys import create_api_key
from app.auth.principal import Principal
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.dashboard import queries
from app.models import ApiKey, WebhookDelivery
from app.submissions import service as submissions
from app.webhooks import endpoints

PROBLEM = "embedding_backward"
H200 = "NVIDIA H200"
CLEAN = {"static": "passed", "benchmark": "passed", "probes": "passed", "canary": "passed"}
CAUGHT = {"static": "passed", "benchmark": "passed", "probes": "failed", "canary": "passed"}
# the canary's own run broke: inconclusive, although every number the board shows looks best
ERRORED = {"static": "passed", "benchmark": "passed", "probes": "passed", "canary": "error"}


class _NoBroker:
    def send(self, audit_id: str, queue: str) -> bool:
        return True


@dataclass(frozen=True)
class Seed:
    label: str
    submitter: str
    kernel: str  # runs with the same kernel label have identical sources
    kernel_ms: float
    reference_ms: float
    ci: tuple[float, float]
    stages: dict[str, str]
    hardware: str = "cpu"
    status: str | None = None  # None: from the stages

    @property
    def speedup(self) -> float:
        return self.reference_ms / self.kernel_ms


# ordered by kernel time, the old API's order (the error at the top) is nothing like the speedup's
SEEDS = [
    Seed("error", "carol", "E", 0.01, 0.50, (48.0, 52.0), ERRORED),
    Seed("timed_out", "carol", "F", 0.02, 0.80, (38.0, 42.0), CLEAN, status="timed_out"),
    Seed("caught", "bob", "D", 0.10, 0.70, (6.8, 7.2), CAUGHT),
    Seed("small", "bob", "C", 0.10, 0.45, (4.4, 4.6), CLEAN),
    Seed("best", "alice", "B", 0.50, 5.00, (9.5, 10.5), CLEAN),
    # one kernel submitted four times, by two submitters, each run timed differently
    Seed("dup1", "alice", "A", 1.00, 4.00, (3.8, 4.2), CLEAN),
    Seed("dup2", "bob", "A", 1.00, 4.40, (4.1, 4.6), CLEAN),
    Seed("dup3", "alice", "A", 1.00, 3.60, (3.3, 3.9), CLEAN),
    Seed("dup4", "alice", "A", 1.00, 5.00, (4.7, 5.3), CLEAN),
    # the GPU board: B's very source again (not folded with its CPU run), and a faster kernel
    Seed("gpu_b", "alice", "B", 1.00, 2.00, (1.9, 2.1), CLEAN, hardware=H200),
    Seed("gpu_h", "bob", "H", 1.00, 3.00, (2.9, 3.1), CLEAN, hardware=H200),
]


def _source(kernel: str) -> dict[str, Any]:
    data = example("pytorch_fp32")
    data["sources"][0]["content"] += f"\n# kernel {kernel}\n"
    return data


def _finished(sessions: sessionmaker[Session], settings: Settings, seed: Seed) -> str:
    """Submit, then what the audit task does: claim, store each stage, finish and call the hook in one transaction."""
    with UnitOfWork(sessions, _NoBroker()) as uow:  # type: ignore[arg-type]
        key = uow.session.scalar(select(ApiKey).where(ApiKey.submitter == seed.submitter))
        assert key is not None
        data = _source(seed.kernel)
        data["name"] = seed.label
        acc = submissions.submit(
            uow,
            settings,
            Principal(key.id, seed.submitter, frozenset({"submit"})),
            problem_name=PROBLEM,
            problem_hash="h",
            solution_name=seed.label,
            data=data,
            idempotency_key=None,
            device="cpu" if seed.hardware == "cpu" else "cuda:0",
        )
    with sessions.begin() as s:
        assert repository.claim(s, acc.audit_id, "w", 60)
        for pos, (name, status) in enumerate(seed.stages.items(), start=1):
            metrics: dict[str, Any] = {}
            if name == "benchmark":
                timing = {"hardware": seed.hardware, "speedup_ci": list(seed.ci), "indicative": seed.hardware == "cpu"}
                metrics = {
                    "kernel_median_ms": seed.kernel_ms,
                    "reference_median_ms": seed.reference_ms,
                    "speedup": seed.speedup,
                    "speedup_ci": list(seed.ci),
                    "passes_benchmark": True,
                    "timing": timing,
                }
            repository.store_stage(
                s,
                acc.audit_id,
                "w",
                name=name,
                position=pos,
                status=status,
                summary="",
                metrics=metrics,
                evidence={},
                duration_s=1,
                lease_s=60,
            )
        failed = [n for n, st in seed.stages.items() if st == "failed"]
        errored = [n for n, st in seed.stages.items() if st == "error"]
        status = seed.status or ("failed" if failed else "error" if errored else "passed")
        verdict = {"passed": "pass", "failed": "fail"}.get(status, "error")
        repository.store_stage(
            s,
            acc.audit_id,
            "w",
            name="verdict",
            position=9,
            status=status,
            summary="",
            metrics={
                "caught_by": failed,
                "passes_benchmark": True,
                "numerically_sound": seed.stages.get("probes") == "passed",
            },
            evidence={},
            duration_s=0,
            lease_s=60,
        )
        assert repository.finish(s, acc.audit_id, "w", status, verdict, "")
        events.audit_completed(s, acc.audit_id)
    return acc.submission_id


@pytest.fixture
def seeded(service_settings: Settings, tmp_path: Path) -> Iterator[tuple[dict[str, str], str, sessionmaker[Session]]]:
    """The seeded problem on Postgres, an admin's webhook endpoint for rank changes, and the API serving it."""
    bootstrap(service_settings)
    engine = make_engine(service_settings)
    sessions = make_sessionmaker(engine)
    with sessions.begin() as s:
        create_api_key(s, "carol")
        admin = s.scalar(select(ApiKey).where(ApiKey.submitter == "admin"))
        assert admin is not None
        endpoints.create(s, admin.id, "https://hooks.example/admin", ["leaderboard.rank_changed"])
    ids = {seed.label: _finished(sessions, service_settings, seed) for seed in SEEDS}
    api, url = start_api(service_settings, tmp_path / "api.log")
    try:
        yield ids, url, sessions
    finally:
        api.kill()
        engine.dispose()


def _api(url: str, **params: Any) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/v1/leaderboard/{PROBLEM}", params=params, timeout=10)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["rows"]
    return rows


def _cell(row_html: str, cls: str) -> int | None:
    found = re.search(rf'<td class="num {cls}">([^<]*)</td>', row_html)
    assert found is not None, row_html
    return None if found.group(1) == "—" else int(found.group(1))


def _dashboard(url: str) -> dict[str, tuple[int | None, int | None]]:
    """submission id -> (benchmark rank, audited rank), as the leaderboard page shows them."""
    page = httpx.get(f"{url}/problems/{PROBLEM}", timeout=10)
    assert page.status_code == 200
    out = {}
    for chunk in page.text.split('data-submission="')[1:]:
        sid, rest = chunk.split('"', 1)
        row = rest.split("</tr>", 1)[0]
        out[sid] = (_cell(row, "benchmark-rank"), _cell(row, "audited-rank"))
    return out


def _webhook_ranks(sessions: sessionmaker[Session]) -> dict[tuple[str, str], int | None]:
    """(submission, board) -> the rank the latest leaderboard.rank_changed event announced."""
    with sessions() as s:
        rows = s.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.event == "leaderboard.rank_changed")
            .order_by(WebhookDelivery.created_at)
        ).all()
        return {
            (r.payload["data"]["submission_id"], r.payload["data"]["board"]): r.payload["data"]["new_rank"]
            for r in rows
        }


def test_api_dashboard_and_webhooks_agree_on_every_rank(seeded) -> None:  # type: ignore[no-untyped-def]
    ids, url, sessions = seeded
    name = {v: k for k, v in ids.items()}
    board = _api(url)
    audited = _api(url, sound_only="true")

    # by speedup, per hardware; the caught kernel keeps its benchmark place; A (4.2x, runs 3.3x-5.3x) overlaps C
    # (4.5x) and shares its rank; the error and the timed-out audit are nowhere, whatever their speed
    # (the GPU boards first, the CPU's indicative one last)
    assert [(r["hardware"], r["rank"], name[r["submission_id"]]) for r in board] == [
        (H200, 1, "gpu_h"),
        (H200, 2, "gpu_b"),
        ("cpu", 1, "best"),
        ("cpu", 2, "caught"),
        ("cpu", 3, "small"),
        ("cpu", 3, "dup1"),
    ]
    assert [(r["hardware"], r["rank"], name[r["submission_id"]]) for r in audited] == [
        (H200, 1, "gpu_h"),
        (H200, 2, "gpu_b"),
        ("cpu", 1, "best"),
        ("cpu", 2, "small"),
        ("cpu", 2, "dup1"),
    ]
    assert [r["tied"] for r in board] == [False, False, False, False, True, True]
    assert board[3]["verdict"] == "fail" and board[3]["caught_by"] == "probes"
    assert all(r["indicative"] is (r["hardware"] == "cpu") for r in board)
    assert [name[r["submission_id"]] for r in _api(url, hardware=H200)] == ["gpu_h", "gpu_b"]

    dashboard = _dashboard(url)
    api_ranks = {r["submission_id"]: r["rank"] for r in board}
    api_audited = {r["submission_id"]: r["rank"] for r in audited}
    webhooks = _webhook_ranks(sessions)
    # the dashboard lists each entry once (the three re-runs of A are inside dup1's entry) and every unranked run
    assert set(dashboard) == set(ids.values()) - {ids["dup2"], ids["dup3"], ids["dup4"]}
    for sid in ids.values():
        expected = (api_ranks.get(sid), api_audited.get(sid))
        if sid in dashboard:
            assert dashboard[sid] == expected, name[sid]
        assert (webhooks.get((sid, "leaderboard")), webhooks.get((sid, "audited"))) == expected, name[sid]
    assert dashboard[ids["error"]] == dashboard[ids["timed_out"]] == (None, None)


def test_one_kernel_submitted_four_times_is_one_entry_covering_every_run(seeded) -> None:  # type: ignore[no-untyped-def]
    ids, url, sessions = seeded
    runs = [s for s in SEEDS if s.kernel == "A"]
    entry = next(r for r in _api(url) if r["submission_id"] == ids["dup1"])
    assert entry["runs"] == 4 and entry["submission_ids"] == [ids[s.label] for s in runs]
    lo, hi = entry["speedup_ci"]
    assert (lo, hi) == (min(s.ci[0] for s in runs), max(s.ci[1] for s in runs))
    assert all(lo <= s.ci[0] and s.ci[1] <= hi and lo <= s.speedup <= hi for s in runs)
    assert entry["speedup"] == pytest.approx(statistics.median(s.speedup for s in runs))
    assert entry["submitter"] == "alice"  # credited to the earliest submission, whoever sent the copies
    with sessions() as s:  # the dashboard's own query shows the same entry
        row = next(r for r in queries.board(s, PROBLEM, queries.RowFilter.all) if r.submission_id == ids["dup1"])
        assert (row.runs, row.speedup_ci, row.tied, row.benchmark_rank) == (4, [lo, hi], True, entry["rank"])
        folded = queries.submission(s, ids["dup3"])
        assert folded is not None and folded.folded_into == ids["dup1"] and folded.entry_runs == 4
        assert folded.benchmark_rank == entry["rank"]


def test_the_migration_folds_and_ranks_audits_finished_before_it(service_settings: Settings) -> None:
    """Audits finished under revision 0007 (no hashes, no hardware, no intervals): the upgrade computes each run's
    kernel hash from its stored solution JSON and ranks every problem with the one ranking."""
    from app.core import migrate
    from app.models import LeaderboardEntry

    engine = bootstrap_at(service_settings, "0007", ["alice", "bob"])
    sessions = make_sessionmaker(engine)
    try:
        ids = []
        for seed in (SEEDS[5], SEEDS[6], SEEDS[3]):  # dup1 and dup2 (kernel A), small (kernel C)
            with UnitOfWork(sessions, _NoBroker()) as uow:  # type: ignore[arg-type]
                key = uow.session.scalar(select(ApiKey).where(ApiKey.submitter == seed.submitter))
                assert key is not None
                acc = submissions.submit(
                    uow,
                    service_settings,
                    Principal(key.id, seed.submitter, frozenset({"submit"})),
                    problem_name=PROBLEM,
                    problem_hash="h",
                    solution_name=seed.label,
                    data=_source(seed.kernel),
                    idempotency_key=None,
                )
            with sessions.begin() as s:  # finished as 0007's code did, without the leaderboard's hook
                assert repository.claim(s, acc.audit_id, "w", 60)
                repository.store_stage(
                    s,
                    acc.audit_id,
                    "w",
                    name="benchmark",
                    position=2,
                    status="passed",
                    summary="",
                    metrics={"kernel_median_ms": seed.kernel_ms, "reference_median_ms": seed.reference_ms},
                    evidence={},
                    duration_s=1,
                    lease_s=60,
                )
                assert repository.finish(s, acc.audit_id, "w", "passed", "pass", "")
            ids.append(acc.submission_id)
        migrate.upgrade(service_settings)
        with sessions() as s:
            rows = {e.submission_id: e for e in s.scalars(select(LeaderboardEntry))}
    finally:
        engine.dispose()
    dup1, dup2, small = (rows[i] for i in ids)
    assert dup1.kernel_hash == dup2.kernel_hash != small.kernel_hash and dup1.hardware == small.hardware == "cpu"
    assert (dup1.runs, dup2.folded_into, dup2.rank) == (2, dup1.submission_id, None)
    # 4.5x against 4.0x and 4.4x, points only (no intervals were recorded then): no overlap, no tie
    assert (small.rank, dup1.rank, small.audited_rank, dup1.audited_rank) == (1, 2, 1, 2)


def test_ties_are_dense_and_measured_against_the_fastest_of_the_group() -> None:
    """B overlaps A and shares its rank; C overlaps B but not A: a chain of overlaps does not tie C with A."""
    from datetime import datetime, timedelta

    from app.leaderboard.ranking import Run, rank_boards

    t0 = datetime(2026, 1, 1)

    def run(label: str, speedup: float, lo: float, hi: float, status: str = "passed") -> Run:
        return Run(
            submission_id=label,
            submitter="x",
            solution_name=label,
            submitted_at=t0 + timedelta(seconds=ord(label[0])),
            kernel_hash=label,
            hardware="cpu",
            status=status,
            verdict="pass" if status == "passed" else "fail",
            passes_benchmark=True,
            speedup=speedup,
            speedup_lo=lo,
            speedup_hi=hi,
        )

    boards = rank_boards(
        [
            run("A", 11, 10, 12),
            run("B", 10, 9, 11),
            run("C", 9, 8, 9.5),
            run("D", 5, 4.9, 5.1),
            run("E", 30, 29, 31, status="error"),
            run("F", 4, 3.9, 4.1, status="failed"),
        ]
    )
    assert [(e.submission_id, e.rank, e.tied) for e in boards[("benchmark", "cpu")]] == [
        ("A", 1, True),
        ("B", 1, True),
        ("C", 2, False),
        ("D", 3, False),
        ("F", 4, False),
    ]
    assert [(e.submission_id, e.rank) for e in boards[("audited", "cpu")]] == [("A", 1), ("B", 1), ("C", 2), ("D", 3)]
