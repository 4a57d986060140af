"""Trace retention: per-tenant retention overrides, and when a workflow was exported.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28

The trace store kept every workflow forever. `conductor traces prune` deletes the workflows
past their retention (CONDUCTOR_TRACE_RETENTION_DAYS, or a tenant's own from the
tenant_retention table: a number of days, or NULL to keep them all); a workflow with feedback
or a reference label is kept until `conductor traces export` has written it, which sets its
exported_at.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workflow") as batch:
        batch.add_column(sa.Column("exported_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "tenant_retention",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("retention_days", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_tenant_retention")),
    )


def downgrade() -> None:
    op.drop_table("tenant_retention")
    with op.batch_alter_table("workflow") as batch:
        batch.drop_column("exported_at")
