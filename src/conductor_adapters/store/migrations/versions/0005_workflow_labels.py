"""Workflow labels: the free-form metadata a client submits with a workflow.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21

Labels (a client's request id, a team name) are stored with the workflow for audit and
filtering; they are never shown to a model.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("workflow") as batch:
        batch.add_column(sa.Column("labels", JSON, nullable=False, server_default=sa.text("'{}'")))


def downgrade() -> None:
    with op.batch_alter_table("workflow") as batch:
        batch.drop_column("labels")
