"""Aggregators send queue messages only after the state that sends them is committed.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28

Steps were sent before their workflow's transaction committed: an aggregator that died or
failed in between had sent calls its redelivered message sent again (issue 36 #13). The
messages are now rows of this table, written in the same transaction and deleted once sent.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("task", sa.String(length=100), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("args", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflow.id"],
            name=op.f("fk_outbox_workflow_id_workflow"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
    )
    op.create_index(op.f("ix_outbox_created_at"), "outbox", ["created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_outbox_created_at"), table_name="outbox")
    op.drop_table("outbox")
