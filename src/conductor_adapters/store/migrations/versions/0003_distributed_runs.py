"""Distributed runtime: each workflow's live state and its numbered events.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21

``workflow_run`` holds the state an aggregator locks (one row lock per workflow) and the next
deadline the sweeper looks for; ``workflow_event`` holds the events clients stream and replay.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "workflow_run",
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("request", JSON, nullable=False),
        sa.Column("state", JSON, nullable=True),
        sa.Column("next_deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflow.id"],
            name=op.f("fk_workflow_run_workflow_id_workflow"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workflow_id", name=op.f("pk_workflow_run")),
    )
    op.create_index("ix_workflow_run_due", "workflow_run", ["status", "next_deadline_at"])
    op.create_table(
        "workflow_event",
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflow.id"],
            name=op.f("fk_workflow_event_workflow_id_workflow"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workflow_id", "sequence", name=op.f("pk_workflow_event")),
    )


def downgrade() -> None:
    op.drop_table("workflow_event")
    op.drop_index("ix_workflow_run_due", table_name="workflow_run")
    op.drop_table("workflow_run")
