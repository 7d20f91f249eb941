"""Migration 0009: the leaderboard's `{stage}_status` columns go, each stage's status is read from the audit's stage
results (any registered stage), and the downgrade brings the columns back filled from those results."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect
from svc_support import bootstrap_at
from test_leaderboard_table import PROBLEM, _run, _submit

from app.core import migrate
from app.core.db import make_sessionmaker
from app.core.settings import Settings
from app.dashboard import queries
from app.leaderboard.repository import refresh_entry
from app.leaderboard.service import leaderboard

COLUMNS = ("static_status", "benchmark_status", "probes_status", "canary_status")
CAUGHT = {"static": "passed", "benchmark": "passed", "probes": "failed"}
ENTRIES = sa.table(
    "leaderboard_entries", sa.column("submission_id", sa.String), *(sa.column(c, sa.String) for c in COLUMNS)
)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_statuses_move_to_the_stage_results_and_back(backend: str, request: pytest.FixtureRequest) -> None:
    settings: Settings = request.getfixturevalue("sqlite_settings" if backend == "sqlite" else "service_settings")
    engine = bootstrap_at(settings, "0008", ["alice"])
    sessions = make_sessionmaker(engine)
    try:
        sid, audit_id = _submit(sessions, settings, "alice", "fast_bf16")
        _run(sessions, audit_id, 0.05, CAUGHT, hook=refresh_entry)
        with engine.begin() as conn:  # the columns as revision 0008's code wrote them
            conn.execute(
                ENTRIES.update().values(static_status="passed", benchmark_status="passed", probes_status="failed")
            )

        migrate.upgrade(settings)
        with engine.connect() as conn:
            assert not set(COLUMNS) & {c["name"] for c in inspect(conn).get_columns("leaderboard_entries")}
        with sessions() as s:
            [row] = leaderboard(s, PROBLEM).rows  # the stored API row, rewritten with the stages
            [board] = queries.board(s, PROBLEM, queries.RowFilter.all)
        assert row.submission_id == board.submission_id == sid and row.stages == board.stages == CAUGHT

        migrate.downgrade(settings, "0008")
        with engine.connect() as conn:
            assert conn.execute(sa.select(*(ENTRIES.c[c] for c in COLUMNS))).all() == [
                ("passed", "passed", "failed", None)
            ]
    finally:
        engine.dispose()
