"""Stored responses of the OpenAI Responses API: what each was asked, to read back and continue.

A response is a workflow (its id is the workflow's, and the workflow row holds its answer) or
one worker's call (its answer is kept here, in ``output``). Every read and change is scoped to
the tenant: another tenant's response is missing, never forbidden. A response sent with
``store: false`` keeps a row without its content, so its id can be told apart from an unknown
one; a deleted response keeps its row, marked and emptied of what it was asked.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, bindparam, insert, select, update

from conductor_adapters.store.models import response_table


class StoredResponse(BaseModel):
    """A response as stored (``deleted_at`` set: it was deleted and holds nothing more)."""

    id: uuid.UUID
    tenant: str
    model: str
    workflow_id: uuid.UUID | None
    store: bool
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]  # chat turns: role, content, tool_calls, tool_call_id
    instructions: str | None
    previous_response_id: str | None
    settings: dict[str, Any]
    labels: dict[str, str]
    output: dict[str, Any] | None
    created_at: datetime
    deleted_at: datetime | None = None


def insert_response(engine: Engine, response: StoredResponse) -> None:
    """Record a response; one sent with ``store: false`` is recorded without its content."""
    values = response.model_dump()
    if not response.store:
        values.update(input_items=[], history=[], instructions=None, settings={}, output=None)
    with engine.begin() as conn:
        conn.execute(insert(response_table).values(**values))


_LOAD = select(response_table).where(
    response_table.c.id == bindparam("response"), response_table.c.tenant == bindparam("tenant")
)


def load_response(engine: Engine, response_id: uuid.UUID, tenant: str) -> StoredResponse | None:
    """The tenant's response, deleted or not; None when the tenant has no such response."""
    with engine.connect() as conn:
        row = (
            conn.execute(_LOAD, {"response": response_id, "tenant": tenant})
            .mappings()
            .one_or_none()
        )
    return None if row is None else StoredResponse.model_validate(dict(row))


def delete_response(engine: Engine, response_id: uuid.UUID, tenant: str) -> bool:
    """Mark the tenant's stored response deleted and drop what it was asked and answered (the
    workflow, if any, keeps its trace). False when there was no such response to delete."""
    query = (
        update(response_table)
        .where(
            response_table.c.id == response_id,
            response_table.c.tenant == tenant,
            response_table.c.store.is_(True),
            response_table.c.deleted_at.is_(None),
        )
        .values(
            deleted_at=datetime.now(UTC),
            input_items=[],
            history=[],
            instructions=None,
            output=None,
        )
    )
    with engine.begin() as conn:
        return conn.execute(query).rowcount > 0
