"""webhooks: the outbox is unique per (event, endpoint), endpoints count failures, a delivery log

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 05:15:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_endpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("disabled_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("disabled_reason", sa.String(length=500), nullable=True))

    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("event_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("locked_until", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("dispatch_token", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("last_error", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("delivered_at", sa.DateTime(), nullable=True))
    op.execute("UPDATE webhook_deliveries SET event_id = id WHERE event_id IS NULL")  # no sender existed: normally empty
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.alter_column("event_id", existing_type=sa.String(length=64), nullable=False)
        batch_op.alter_column("audit_id", existing_type=sa.String(length=32), nullable=True)
        batch_op.drop_constraint(batch_op.f("uq_webhook_deliveries_endpoint_id"), type_="unique")
        batch_op.create_unique_constraint(batch_op.f("uq_webhook_deliveries_event_id"), ["event_id", "endpoint_id"])
        batch_op.create_index("ix_webhook_deliveries_due", ["status", "next_attempt_at"], unique=False)

    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.String(length=32), nullable=False),
        sa.Column("endpoint_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"],
                                name=op.f("fk_webhook_attempts_delivery_id_webhook_deliveries")),
        sa.ForeignKeyConstraint(["endpoint_id"], ["webhook_endpoints.id"],
                                name=op.f("fk_webhook_attempts_endpoint_id_webhook_endpoints")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
        sa.UniqueConstraint("delivery_id", "attempt", name=op.f("uq_webhook_attempts_delivery_id")),
    )
    with op.batch_alter_table("webhook_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhook_attempts_delivery_id"), ["delivery_id"], unique=False)
        batch_op.create_index("ix_webhook_attempts_endpoint_started", ["endpoint_id", "started_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("webhook_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_attempts_endpoint_started")
        batch_op.drop_index(batch_op.f("ix_webhook_attempts_delivery_id"))
    op.drop_table("webhook_attempts")

    # the old uniqueness (endpoint, audit, event) cannot hold several stage events of one audit: they go
    op.execute("DELETE FROM webhook_deliveries")
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_deliveries_due")
        batch_op.drop_constraint(batch_op.f("uq_webhook_deliveries_event_id"), type_="unique")
        batch_op.create_unique_constraint(batch_op.f("uq_webhook_deliveries_endpoint_id"), ["endpoint_id", "audit_id", "event"])
        batch_op.alter_column("audit_id", existing_type=sa.String(length=32), nullable=False)
        batch_op.drop_column("delivered_at")
        batch_op.drop_column("last_error")
        batch_op.drop_column("dispatch_token")
        batch_op.drop_column("locked_until")
        batch_op.drop_column("event_id")

    with op.batch_alter_table("webhook_endpoints", schema=None) as batch_op:
        batch_op.drop_column("disabled_reason")
        batch_op.drop_column("disabled_at")
        batch_op.drop_column("consecutive_failures")
