"""Webhooks: a job's outcome POSTed to its callback URL (or its key's), signed as Standard
Webhooks specifies, retried with backoff until delivered once, every attempt recorded."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from conductor.machine import utcnow
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import create_key, set_webhook
from conductor_adapters.store.models import webhook_delivery_table
from conductor_adapters.webhooks import BACKOFF_S, attempt, claim_due

from fakes.api_fixture import Api
from fakes.webhook_receiver import WebhookReceiver


@pytest.fixture
def receiver_and_key(api: Api) -> Iterator[tuple[WebhookReceiver, str]]:
    engine = api.server.service.engine
    made = create_key(engine, "acme")
    _, secret = set_webhook(engine, made.key.id, None)
    assert secret is not None
    receiver = WebhookReceiver(secret)
    try:
        yield receiver, made.secret
    finally:
        receiver.close()


def _deliveries(api: Api, workflow_id: str) -> list[dict[str, object]]:
    with api.server.service.engine.connect() as conn:
        rows = conn.execute(
            select(webhook_delivery_table).where(
                webhook_delivery_table.c.workflow_id == uuid.UUID(workflow_id)
            )
        ).mappings()
        return [dict(row) for row in rows]


def test_a_jobs_outcome_reaches_its_callback_url_signed(
    api: Api, receiver_and_key: tuple[WebhookReceiver, str]
) -> None:
    receiver, key = receiver_and_key
    labels = {"ticket": "T-7"}
    job = {"question": "What is 6 * 7?", "metadata": labels, "callback_url": receiver.url}
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"}) as http:
        workflow_id = http.post("/v1/workflows", json=job).json()["id"]

    assert receiver.arrived.wait(30), f"no delivery; attempts: {receiver.attempts}"
    [event] = receiver.delivered
    assert receiver.rejected == []
    assert event["type"] == "workflow.completed"
    assert event["data"]["workflow_id"] == workflow_id
    assert event["data"]["answer"]
    assert event["data"]["metadata"] == {"ticket": "T-7"}
    [headers] = receiver.attempts
    assert headers["webhook-id"].startswith("msg_")
    deadline = time.monotonic() + 10
    while _deliveries(api, workflow_id)[0]["status"] != "delivered" and time.monotonic() < deadline:
        time.sleep(0.1)
    [delivery] = _deliveries(api, workflow_id)
    assert delivery["status"] == "delivered"
    assert [a["status_code"] for a in delivery["attempts"]] == [204]


def test_a_callback_url_needs_a_key_that_signs(api: Api) -> None:
    with api.http() as http:  # this key has no signing secret
        refused = http.post(
            "/v1/workflows", json={"question": "6 * 7", "callback_url": "http://127.0.0.1:9/x"}
        )
        bad_url = http.post("/v1/workflows", json={"question": "6 * 7", "callback_url": "ftp://x"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "callback_url"
    assert "signing secret" in refused.json()["error"]["message"]
    assert bad_url.status_code == 400
    assert "http or https URL" in bad_url.json()["error"]["message"]


def test_a_receiver_that_fails_twice_gets_the_event_once_and_every_attempt_is_kept(
    tmp_path: Path,
) -> None:
    # Given a finished job whose key's webhook URL fails twice, then answers
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    upgrade(url)
    engine = make_engine(url)
    made = create_key(engine, "acme")
    _, secret = set_webhook(engine, made.key.id, None)
    assert secret is not None
    receiver = WebhookReceiver(secret, failures=2)
    set_webhook(engine, made.key.id, receiver.url)
    delivery_id = _finished_job(engine, made.key.id)
    try:
        with httpx.Client() as client:
            # When senders deliver what is due, as time passes
            now = utcnow()
            statuses = []
            for backoff in (0.0, BACKOFF_S[0], BACKOFF_S[1]):
                now += timedelta(seconds=backoff)
                assert claim_due(engine, now) == [delivery_id]
                assert claim_due(engine, now) == []  # leased: no second sender gets it
                statuses.append(attempt(engine, delivery_id, client, now))
            later = claim_due(engine, now + timedelta(days=1))
    finally:
        receiver.close()
        engine.dispose()

    # Then it arrived once, verified, after two failures each recorded
    assert statuses == ["pending", "pending", "delivered"]
    assert len(receiver.delivered) == 1
    assert len(receiver.attempts) == 3
    assert len({h["webhook-id"] for h in receiver.attempts}) == 1  # one event, three tries
    assert receiver.rejected == []
    assert later == []
    with make_engine(url).connect() as conn:
        row = conn.execute(select(webhook_delivery_table)).mappings().one()
    assert [a["status_code"] for a in row["attempts"]] == [503, 503, 204]
    assert row["delivered_at"] is not None


def _finished_job(engine: object, key_id: str) -> str:
    """A job submitted with ``key_id`` and finished, through the trace writes both runtimes
    use; returns the delivery it left."""
    from conductor.machine import Aborted, WorkflowMachine
    from conductor.pool import Pool, local_worker
    from conductor.variants import BUILTIN_VARIANTS
    from conductor.workflow import PoolEntry
    from conductor_adapters.store.runs import SubmitRequest, record_workflow
    from conductor_adapters.store.traces import TraceWrites

    workflow_id = uuid.uuid4()
    worker = local_worker()
    request = SubmitRequest(
        question="6 * 7", variant=BUILTIN_VARIANTS["conductor-mini"], tenant="acme", key_id=key_id
    )
    machine = WorkflowMachine.start(
        workflow_id=workflow_id,
        question="6 * 7",
        variant=request.variant,
        entries=[PoolEntry(name=worker.name, description=worker.description)],
    )
    machine.apply(Aborted("stopped for the test"))
    with engine.begin() as conn:  # type: ignore[attr-defined]
        record_workflow(conn, request, workflow_id, datetime.now(UTC))
        writes = TraceWrites("sqlite", Pool(workers=(worker,)))
        writes.for_events(machine.result, machine.take_events())(conn)
        row = conn.execute(select(webhook_delivery_table.c.id)).scalar_one()
    return str(row)
