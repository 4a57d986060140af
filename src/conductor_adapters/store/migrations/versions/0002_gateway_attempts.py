"""Gateway accounting: reasoning tokens everywhere; per attempt, who was called and quota wait.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21

Retries and fallbacks make several attempts per step, possibly on different workers, so each
attempt names its worker. Existing rows get 0 and NULL (nothing was measured for them).
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _zero(name: str, type_: sa.types.TypeEngine[Any]) -> sa.Column[Any]:
    return sa.Column(name, type_, nullable=False, server_default="0")


def upgrade() -> None:
    for table in ("workflow", "step", "attempt"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(_zero("reasoning_tokens", sa.Integer()))
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(sa.Column("worker", sa.String(), nullable=True))
        batch.add_column(_zero("quota_wait_ms", sa.Float()))
    # The server defaults only filled old rows; the models set every value themselves.
    for table, column in (
        ("workflow", "reasoning_tokens"),
        ("step", "reasoning_tokens"),
        ("attempt", "reasoning_tokens"),
        ("attempt", "quota_wait_ms"),
    ):
        with op.batch_alter_table(table) as batch:
            batch.alter_column(column, server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.drop_column("quota_wait_ms")
        batch.drop_column("worker")
    for table in ("workflow", "step", "attempt"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("reasoning_tokens")
