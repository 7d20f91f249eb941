"""leaderboard entries: no column per stage; each stage's status is read from the audit's stage results

The four `{stage}_status` columns were copies of the statuses in `stage_results` (the entry's audit's rows), so a
stage added to the registry (worker.registry) needed a migration to be shown. The statuses stay where they were
written: the boards now read them from `stage_results` (app.audits.repository.stage_statuses), and every entry is
rewritten and re-ranked so that its stored API row carries them (`stages`). The downgrade adds the columns back and
fills them from the same rows.

Revision ID: 0009
Revises: 0008
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STAGES = ("static", "benchmark", "probes", "canary")  # the stages that had a column, as revision 0003 made them
ENTRIES = sa.table("leaderboard_entries", sa.column("audit_id", sa.String), *(sa.column(f"{s}_status", sa.String) for s in STAGES))
RESULTS = sa.table("stage_results", sa.column("audit_id", sa.String), sa.column("name", sa.String), sa.column("status", sa.String))


def upgrade() -> None:
    # every entry again, from its audit, with its stages read from its results (the code that keeps the table current)
    from app.leaderboard.repository import rebuild

    session = Session(bind=op.get_bind())
    rebuild(session)
    session.flush()
    with op.batch_alter_table("leaderboard_entries", schema=None) as batch_op:
        for stage in reversed(STAGES):
            batch_op.drop_column(f"{stage}_status")


def downgrade() -> None:
    with op.batch_alter_table("leaderboard_entries", schema=None) as batch_op:
        for stage in STAGES:
            batch_op.add_column(sa.Column(f"{stage}_status", sa.String(length=16), nullable=True))
    for stage in STAGES:
        status = (sa.select(RESULTS.c.status)
                  .where(RESULTS.c.audit_id == ENTRIES.c.audit_id, RESULTS.c.name == stage).scalar_subquery())
        op.execute(ENTRIES.update().values({f"{stage}_status": status}))
