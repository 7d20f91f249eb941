"""uploaded definitions: problems carry their origin and, when uploaded, the definition bundle

Revision ID: 0005
Revises: 0003
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("problems") as batch:
        batch.add_column(sa.Column("origin", sa.String(length=16), nullable=False, server_default="catalogue"))
        batch.add_column(sa.Column("bundle", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("uploaded_by", sa.String(length=32), nullable=True))
        batch.create_foreign_key("fk_problems_uploaded_by", "api_keys", ["uploaded_by"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("fk_problems_uploaded_by", type_="foreignkey")
        batch.drop_column("uploaded_by")
        batch.drop_column("bundle")
        batch.drop_column("origin")
