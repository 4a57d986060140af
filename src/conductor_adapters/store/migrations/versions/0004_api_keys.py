"""API keys: tenants and what each key may use.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21

A key is stored as its public id and the SHA-256 of its secret; the secret is shown once, when
the key is made, and never stored.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "api_key",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("secret_sha256", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("allowed_pool", JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_key")),
    )
    op.create_index(op.f("ix_api_key_tenant"), "api_key", ["tenant"])


def downgrade() -> None:
    op.drop_index(op.f("ix_api_key_tenant"), table_name="api_key")
    op.drop_table("api_key")
