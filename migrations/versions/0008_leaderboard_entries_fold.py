"""leaderboard entries: one ranking by speedup, per hardware, identical kernels folded, speedup intervals

Each run records the kernel's content hash, the hardware it was timed on, its speedup interval and whether its
figures are only indicative (CPU); each board entry records its order and how many runs it folds in, and a folded
run names the entry it belongs to. Every row is rewritten and every problem re-ranked with the new rules
(app.leaderboard.ranking).

Revision ID: 0008
Revises: 0007
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("kernel_hash", sa.String(length=64)),
    ("hardware", sa.String(length=200)),
    ("speedup_lo", sa.Float()),
    ("speedup_hi", sa.Float()),
    ("indicative", sa.Boolean()),
    ("folded_into", sa.String(length=32)),
    ("runs", sa.Integer()),
    ("position", sa.Integer()),
    ("sound_position", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("leaderboard_entries", schema=None) as batch_op:
        for name, type_ in COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))

    # every row again, from its audit, under the new rules (the same code that keeps the table current afterwards)
    from app.leaderboard.repository import rebuild

    session = Session(bind=op.get_bind())
    rebuild(session)
    session.flush()


def downgrade() -> None:
    with op.batch_alter_table("leaderboard_entries", schema=None) as batch_op:
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
