"""problem namespaces and visibility, and each webhook attempt's own outcome

Uploaded problems move to their uploader's namespace ('<name>@<first 12 of the key id>', the address
app.problems.namespaces gives every new upload) with their submissions and leaderboard rows, so no upload holds a
name the catalogue may bring; they become private until an admin publishes them, and can be deleted (deleted_at).
Webhook attempts record their own outcome (delivered or failed) and the retry the backoff scheduled, instead of
borrowing their delivery's latest status.

Revision ID: 0007
Revises: 0006
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAMESPACE_CHARS = 12
MAX_UPLOAD_NAME_CHARS = 200 - 1 - NAMESPACE_CHARS

problems = sa.table(
    "problems", sa.column("name", sa.String), sa.column("description", sa.Text), sa.column("content_hash", sa.String),
    sa.column("definition", sa.JSON), sa.column("probes", sa.JSON), sa.column("synced_at", sa.DateTime),
    sa.column("origin", sa.String), sa.column("bundle", sa.JSON), sa.column("uploaded_by", sa.String),
    sa.column("namespace", sa.String), sa.column("public", sa.Boolean), sa.column("deleted_at", sa.DateTime),
)
CHILDREN = ("submissions", "leaderboard_entries")  # the tables whose problem_name refers to problems.name


def _rename(conn: sa.Connection, row: dict[str, object], new_name: str, **changes: object) -> None:
    """Give a problem a new address: the new row first, then its children, then the old row (every FK holds throughout)."""
    conn.execute(problems.insert().values({**row, "name": new_name, **changes}))
    for child in CHILDREN:
        t = sa.table(child, sa.column("problem_name", sa.String))
        conn.execute(t.update().where(t.c.problem_name == row["name"]).values(problem_name=new_name))
    conn.execute(problems.delete().where(problems.c.name == row["name"]))


def upgrade() -> None:
    with op.batch_alter_table("problems") as batch:
        batch.add_column(sa.Column("namespace", sa.String(length=32), nullable=False, server_default="catalogue"))
        batch.add_column(sa.Column("public", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("deleted_at", sa.DateTime(), nullable=True))
    conn = op.get_bind()
    for row in [dict(r) for r in conn.execute(sa.select(problems).where(problems.c.origin == "uploaded")).mappings()]:
        namespace = str(row["uploaded_by"] or "legacy")[:NAMESPACE_CHARS]
        _rename(conn, row, f"{str(row['name'])[:MAX_UPLOAD_NAME_CHARS]}@{namespace}", namespace=namespace, public=False)

    with op.batch_alter_table("webhook_attempts") as batch:
        batch.add_column(sa.Column("outcome", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("retry_at", sa.DateTime(), nullable=True))
    op.execute("UPDATE webhook_attempts SET outcome = CASE WHEN error IS NULL AND status_code >= 200 AND status_code < 300 "
               "THEN 'delivered' ELSE 'failed' END")
    with op.batch_alter_table("webhook_attempts") as batch:
        batch.alter_column("outcome", existing_type=sa.String(length=16), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("webhook_attempts") as batch:
        batch.drop_column("retry_at")
        batch.drop_column("outcome")

    conn = op.get_bind()
    taken = set(conn.scalars(sa.select(problems.c.name)))
    for row in [dict(r) for r in conn.execute(sa.select(problems).where(problems.c.origin == "uploaded")).mappings()]:
        bare = str(row["name"]).rsplit("@", 1)[0]
        if bare not in taken:  # back to the bare name where nothing holds it (a name the catalogue took stays namespaced)
            _rename(conn, row, bare)
            taken.add(bare)
    with op.batch_alter_table("problems") as batch:
        batch.drop_column("deleted_at")
        batch.drop_column("public")
        batch.drop_column("namespace")
