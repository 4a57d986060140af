"""Workers called directly count against their key's limits: each call's tokens and cost.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26

A pass-through call (model = a worker's name) is no workflow, so the trace table never saw
what it spent, and a key's budget and tokens per minute let it through unbounded. Each such
call by a key now leaves a row, read with the key's workflows.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "direct_call",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("worker", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_direct_call")),
    )
    op.create_index("ix_direct_call_key_at", "direct_call", ["key_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_direct_call_key_at", table_name="direct_call")
    op.drop_table("direct_call")
