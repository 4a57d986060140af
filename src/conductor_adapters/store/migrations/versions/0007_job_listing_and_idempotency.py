"""Job listing and idempotent submission.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26

A tenant's workflows are listed newest first, page by page: an index on (tenant, created_at,
id) keeps a page one index range, however many workflows the database holds. A submission
may carry an Idempotency-Key: the key and a hash of the request are kept with the workflow,
unique per tenant, so the same key with the same request gives back the same workflow, and
with another request is refused.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workflow") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
    op.create_index(
        "ix_workflow_tenant_created", "workflow", ["tenant", "created_at", "id"], unique=False
    )
    op.create_index(
        "ux_workflow_tenant_idempotency_key",
        "workflow",
        ["tenant", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ux_workflow_tenant_idempotency_key", table_name="workflow")
    op.drop_index("ix_workflow_tenant_created", table_name="workflow")
    with op.batch_alter_table("workflow") as batch:
        batch.drop_column("request_hash")
        batch.drop_column("idempotency_key")
