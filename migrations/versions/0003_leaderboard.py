"""leaderboard entries: one row per submission's latest finished audit, ranks precomputed

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 05:30:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('leaderboard_entries',
    sa.Column('submission_id', sa.String(length=32), nullable=False),
    sa.Column('audit_id', sa.String(length=32), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('problem_name', sa.String(length=200), nullable=False),
    sa.Column('submitter', sa.String(length=200), nullable=False),
    sa.Column('solution_name', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('verdict', sa.String(length=16), nullable=True),
    sa.Column('caught_by', sa.String(length=32), nullable=True),
    sa.Column('kernel_ms', sa.Float(), nullable=True),
    sa.Column('reference_ms', sa.Float(), nullable=True),
    sa.Column('speedup', sa.Float(), nullable=True),
    sa.Column('passes_benchmark', sa.Boolean(), nullable=True),
    sa.Column('numerically_sound', sa.Boolean(), nullable=True),
    sa.Column('static_status', sa.String(length=16), nullable=True),
    sa.Column('benchmark_status', sa.String(length=16), nullable=True),
    sa.Column('probes_status', sa.String(length=16), nullable=True),
    sa.Column('canary_status', sa.String(length=16), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('sound_rank', sa.Integer(), nullable=True),
    sa.Column('benchmark_rank', sa.Integer(), nullable=True),
    sa.Column('audited_rank', sa.Integer(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('row_json', sa.Text(), nullable=True),
    sa.Column('sound_row_json', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['audit_id'], ['audits.id'], name=op.f('fk_leaderboard_entries_audit_id_audits')),
    sa.ForeignKeyConstraint(['problem_name'], ['problems.name'], name=op.f('fk_leaderboard_entries_problem_name_problems')),
    sa.ForeignKeyConstraint(['submission_id'], ['submissions.id'], name=op.f('fk_leaderboard_entries_submission_id_submissions')),
    sa.PrimaryKeyConstraint('submission_id', name=op.f('pk_leaderboard_entries'))
    )
    with op.batch_alter_table('leaderboard_entries', schema=None) as batch_op:
        batch_op.create_index('ix_leaderboard_entries_problem_benchmark_rank', ['problem_name', 'benchmark_rank'], unique=False)
        batch_op.create_index('ix_leaderboard_entries_problem_rank', ['problem_name', 'rank'], unique=False)
        batch_op.create_index('ix_leaderboard_entries_problem_sound_rank', ['problem_name', 'sound_rank'], unique=False)

    # backfill from the audits already finished (the same code that keeps the table current afterwards)
    from app.leaderboard.repository import rebuild

    session = Session(bind=op.get_bind())
    rebuild(session)
    session.flush()


def downgrade() -> None:
    with op.batch_alter_table('leaderboard_entries', schema=None) as batch_op:
        batch_op.drop_index('ix_leaderboard_entries_problem_sound_rank')
        batch_op.drop_index('ix_leaderboard_entries_problem_rank')
        batch_op.drop_index('ix_leaderboard_entries_problem_benchmark_rank')

    op.drop_table('leaderboard_entries')
