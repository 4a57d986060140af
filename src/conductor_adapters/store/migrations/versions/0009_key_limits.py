"""Per-key limits: requests and tokens per minute, concurrent workflows, a budget per period.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26

Each API key may carry limits; every workflow now records the key that submitted it, so a
key's workflows running, its tokens of the last minute and its spend in the current period
are read from the trace table, exact across every API replica. The (key_id, created_at) index
keeps those reads one index range.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_key") as batch:
        batch.add_column(sa.Column("rpm_limit", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tpm_limit", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_concurrent", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("budget_usd", sa.Float(), nullable=True))
        batch.add_column(sa.Column("budget_period", sa.String(length=8), nullable=True))
    with op.batch_alter_table("workflow") as batch:
        batch.add_column(sa.Column("key_id", sa.String(length=32), nullable=True))
    op.create_index("ix_workflow_key_created", "workflow", ["key_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_workflow_key_created", table_name="workflow")
    with op.batch_alter_table("workflow") as batch:
        batch.drop_column("key_id")
    with op.batch_alter_table("api_key") as batch:
        for column in ("budget_period", "budget_usd", "max_concurrent", "tpm_limit", "rpm_limit"):
            batch.drop_column(column)
