"""Stored responses of the Responses API, on SQLite and on Postgres: tenant-scoped reads,
``store: false`` keeping nothing of what was asked, deletion, and the cascade from a deleted
workflow."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import Engine, delete, insert, select

from conductor_adapters.store.models import new_workflow_values, response_table, workflow_table
from conductor_adapters.store.responses import (
    StoredResponse,
    delete_response,
    insert_response,
    load_response,
)

ITEM = {
    "id": "msg_1",
    "type": "message",
    "role": "user",
    "status": "completed",
    "content": [{"type": "input_text", "text": "What is 6 * 7?\x00"}],
}


def _workflow(engine: Engine, tenant: str = "acme") -> uuid.UUID:
    workflow_id = uuid.uuid4()
    values = new_workflow_values(
        workflow_id,
        tenant=tenant,
        variant="conductor-ultra",
        question="What is 6 * 7?",
        status="completed",
        created_at=None,
    )
    with engine.begin() as conn:
        conn.execute(insert(workflow_table).values(**values))
    return workflow_id


def _response(workflow_id: uuid.UUID | None, *, store: bool = True) -> StoredResponse:
    return StoredResponse(
        id=workflow_id or uuid.uuid4(),
        tenant="acme",
        model="conductor-ultra",
        workflow_id=workflow_id,
        store=store,
        input_items=[ITEM],
        history=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        instructions="Be brief.",
        previous_response_id="resp_" + "0" * 32,
        settings={"temperature": 0.5, "user": "u-1"},
        labels={"ticket": "T-1"},
        output=None if workflow_id else {"text": "42", "usage": {}, "conductor": {}},
        created_at=datetime.now(UTC),
    )


def test_a_response_reads_back_for_its_tenant_only(engine: Engine) -> None:
    stored = _response(_workflow(engine))
    insert_response(engine, stored)

    loaded = load_response(engine, stored.id, "acme")

    assert loaded is not None
    assert loaded.input_items[0]["content"][0]["text"] == "What is 6 * 7?\ufffd"  # NUL replaced
    assert loaded.model_dump(exclude={"input_items", "created_at"}) == stored.model_dump(
        exclude={"input_items", "created_at"}
    )
    assert load_response(engine, stored.id, "globex") is None
    assert load_response(engine, uuid.uuid4(), "acme") is None


def test_a_response_sent_with_store_false_keeps_nothing_it_was_asked(engine: Engine) -> None:
    stored = _response(None, store=False)
    insert_response(engine, stored)

    loaded = load_response(engine, stored.id, "acme")

    assert loaded is not None
    assert loaded.store is False
    assert (loaded.input_items, loaded.history, loaded.instructions, loaded.output) == (
        [],
        [],
        None,
        None,
    )
    assert delete_response(engine, stored.id, "acme") is False  # nothing stored to delete


def test_deleting_marks_and_empties_the_row_and_the_workflow_stays(engine: Engine) -> None:
    workflow_id = _workflow(engine)
    insert_response(engine, _response(workflow_id))

    assert delete_response(engine, workflow_id, "globex") is False
    assert delete_response(engine, workflow_id, "acme") is True
    assert delete_response(engine, workflow_id, "acme") is False

    loaded = load_response(engine, workflow_id, "acme")
    assert loaded is not None
    assert loaded.deleted_at is not None
    assert (loaded.input_items, loaded.history, loaded.instructions) == ([], [], None)
    with engine.connect() as conn:
        assert conn.execute(select(workflow_table.c.id)).scalars().all() == [workflow_id]


def test_deleting_a_workflow_deletes_its_response(engine: Engine) -> None:
    workflow_id = _workflow(engine)
    insert_response(engine, _response(workflow_id))
    insert_response(engine, _response(None))  # a worker call's: no workflow

    with engine.begin() as conn:
        conn.execute(delete(workflow_table).where(workflow_table.c.id == workflow_id))
        left = conn.execute(select(response_table.c.workflow_id)).scalars().all()

    assert left == [None]
