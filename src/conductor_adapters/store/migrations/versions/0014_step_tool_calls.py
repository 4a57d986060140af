"""The client's functions a step asked to call.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28

A workflow offered tools gives them to the step that writes its answer; that step may answer
with calls for the client to run instead of text, and the trace keeps them: a JSON list of
{id, name, arguments}, empty for every other step (and every step written before).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("step") as batch:
        batch.add_column(
            sa.Column("tool_calls", json_type, nullable=False, server_default=sa.text("'[]'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("step") as batch:
        batch.drop_column("tool_calls")
