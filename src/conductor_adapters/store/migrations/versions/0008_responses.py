"""Stored responses of the OpenAI Responses API.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26

``/v1/responses`` answers with a workflow (or one worker's call) and, unless the client sends
``store: false``, keeps what it was asked (the input items, the instructions, the conversation
before them) so that the response can be read back, its input items listed, and a later
request continue it with ``previous_response_id``. A response belongs to one tenant; deleting it
marks and empties its row, while its workflow's trace stays.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "response",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=True),
        sa.Column("store", sa.Boolean(), nullable=False),
        sa.Column("input_items", JSON, nullable=False),
        sa.Column("history", JSON, nullable=False),
        sa.Column("instructions", sa.Text(), nullable=True),
        sa.Column("previous_response_id", sa.String(length=64), nullable=True),
        sa.Column("settings", JSON, nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("output", JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflow.id"],
            name=op.f("fk_response_workflow_id_workflow"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_response")),
    )
    op.create_index(op.f("ix_response_workflow_id"), "response", ["workflow_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_response_workflow_id"), table_name="response")
    op.drop_table("response")
