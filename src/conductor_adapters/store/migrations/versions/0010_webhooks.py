"""Webhooks: a workflow's outcome delivered to its client, signed, at least once.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26

A job may name a callback_url; an API key may hold a default webhook URL and the secret its
deliveries are signed with (Standard Webhooks). When a workflow ends, a delivery is recorded in
the transaction that stores its outcome, so no outcome is ever left undelivered; every
attempt (its time, HTTP status or error, duration) is kept with it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("api_key") as batch:
        batch.add_column(sa.Column("webhook_url", sa.String(length=2048), nullable=True))
        batch.add_column(sa.Column("webhook_secret", sa.String(length=128), nullable=True))
    with op.batch_alter_table("workflow") as batch:
        batch.add_column(sa.Column("callback_url", sa.String(length=2048), nullable=True))
    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", JSON, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflow.id"],
            name=op.f("fk_webhook_delivery_workflow_id_workflow"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_delivery")),
    )
    op.create_index("ix_webhook_delivery_due", "webhook_delivery", ["status", "next_attempt_at"])
    op.create_index(op.f("ix_webhook_delivery_workflow_id"), "webhook_delivery", ["workflow_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_webhook_delivery_workflow_id"), table_name="webhook_delivery")
    op.drop_index("ix_webhook_delivery_due", table_name="webhook_delivery")
    op.drop_table("webhook_delivery")
    with op.batch_alter_table("workflow") as batch:
        batch.drop_column("callback_url")
    with op.batch_alter_table("api_key") as batch:
        batch.drop_column("webhook_secret")
        batch.drop_column("webhook_url")
