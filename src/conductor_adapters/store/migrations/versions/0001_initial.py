"""Initial trace schema: workflow, step, attempt.

Revision ID: 0001
Revises:
Create Date: 2026-11-21

Hand-written to match conductor_adapters.store.models exactly (a test compares them). Constraint and
index names follow the models' naming convention and are spelled out with op.f().
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _usage_columns(total: bool) -> list[sa.Column[int] | sa.Column[float]]:
    columns: list[sa.Column[int] | sa.Column[float]] = [
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
    ]
    if total:
        columns.append(sa.Column("total_tokens", sa.Integer(), nullable=False))
    columns += [
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
    ]
    return columns


def upgrade() -> None:
    op.create_table(
        "workflow",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("variant", sa.String(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("pool_snapshot", JSON, nullable=False),
        sa.Column("planner_calls", JSON, nullable=False),
        sa.Column("plan", JSON, nullable=False),
        sa.Column("plan_valid", sa.Boolean(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        *_usage_columns(total=True),
        sa.Column("feedback", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workflow")),
    )
    op.create_index(op.f("ix_workflow_tenant"), "workflow", ["tenant"])
    op.create_index(op.f("ix_workflow_status"), "workflow", ["status"])
    op.create_index(op.f("ix_workflow_created_at"), "workflow", ["created_at"])

    op.create_table(
        "step",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("worker", sa.String(), nullable=False),
        sa.Column("subtask", sa.Text(), nullable=False),
        sa.Column("access_list", JSON, nullable=False),
        sa.Column("visible_steps", JSON, nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        *_usage_columns(total=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflow.id"],
            name=op.f("fk_step_workflow_id_workflow"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step")),
        sa.UniqueConstraint("workflow_id", "index", name=op.f("uq_step_workflow_id_index")),
    )

    op.create_table(
        "attempt",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("step_id", sa.Uuid(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("error_class", sa.String(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        *_usage_columns(total=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["step_id"], ["step.id"], name=op.f("fk_attempt_step_id_step"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempt")),
        sa.UniqueConstraint("step_id", "number", name=op.f("uq_attempt_step_id_number")),
    )


def downgrade() -> None:
    op.drop_table("attempt")
    op.drop_table("step")
    op.drop_table("workflow")
