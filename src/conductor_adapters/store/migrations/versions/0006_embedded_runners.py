"""Embedded runners: which process runs each workflow of the embedded runtime, and whether it lives.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25

An embedded runtime (``conductor serve``) runs its workflows in its own process; if that
process dies, nothing else would ever finish them. Each one now registers as a ``runner`` with
a heartbeat and marks its workflows with its id, so a runner whose heartbeat stopped has its
workflows failed with a reason by the next runtime that starts on the same database.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runner",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runner")),
    )
    with op.batch_alter_table("workflow") as batch:
        batch.add_column(sa.Column("runner_id", sa.String(length=64), nullable=True))
        batch.create_index(batch.f("ix_workflow_runner_id"), ["runner_id"])


def downgrade() -> None:
    with op.batch_alter_table("workflow") as batch:
        batch.drop_index(batch.f("ix_workflow_runner_id"))
        batch.drop_column("runner_id")
    op.drop_table("runner")
