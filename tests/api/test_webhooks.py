"""Webhooks: a job's outcome POSTed to its callback URL (or its key's), signed as Standard
Webhooks specifies, retried with backoff until delivered once, every attempt recorded; never
to an address that is not public unless its network is allowed.

The receivers listen on loopback, so the tests that deliver allow it (the setting is read
from the environment where it is used: by the API and by the sender, whichever runtime)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from ipaddress import ip_network
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select

from conductor.machine import utcnow
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import create_key, set_webhook
from conductor_adapters.store.models import webhook_delivery_table
from conductor_adapters.webhooks import BACKOFF_S, attempt, claim_due

from fakes.api_fixture import Api
from fakes.webhook_receiver import WebhookReceiver

ALLOWED = "CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS"
LOOPBACK = (ip_network("127.0.0.0/8"),)


@pytest.fixture
def allow_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED, "127.0.0.0/8")


@pytest.fixture
def receiver_and_key(api: Api, allow_loopback: None) -> Iterator[tuple[WebhookReceiver, str]]:
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
    # And the tenant reads the delivery through the API, every attempt with it
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"}) as http:
        deadline = time.monotonic() + 10
        while True:
            listed = http.get(f"/v1/workflows/{workflow_id}/webhooks")
            assert listed.status_code == 200, listed.text
            [delivery] = listed.json()["data"]
            if delivery["status"] == "delivered" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert delivery["status"] == "delivered"
    assert (delivery["id"], delivery["url"]) == (headers["webhook-id"], receiver.url)
    assert delivery["event_type"] == "workflow.completed"
    assert [a["status_code"] for a in delivery["attempts"]] == [204]
    with api.http(api.other_key) as other:  # another tenant's workflow: not found
        assert other.get(f"/v1/workflows/{workflow_id}/webhooks").status_code == 404


def test_a_failures_webhook_names_no_internal_address(api: Api, allow_loopback: None) -> None:
    """The receiver is the tenant's: its error reads as the API's does, addresses hidden."""
    engine = api.server.service.engine
    made = create_key(engine, "acme", allowed_pool=["delta"])  # delta fails naming DELTA_URL
    _, secret = set_webhook(engine, made.key.id, None)
    assert secret is not None
    receiver = WebhookReceiver(secret)
    try:
        with api.http(made.secret) as http:
            job = {"question": "6 * 7", "callback_url": receiver.url}
            assert http.post("/v1/workflows", json=job).status_code == 202
        assert receiver.arrived.wait(30), f"no delivery; attempts: {receiver.attempts}"
    finally:
        receiver.close()
    [event] = receiver.delivered
    assert event["type"] == "workflow.failed"
    assert "10.20.30.40" not in event["data"]["error"]
    assert "[internal address]" in event["data"]["error"]


def test_a_callback_url_needs_a_key_that_signs(api: Api) -> None:
    with api.http() as http:  # this key has no signing secret
        refused = http.post(
            "/v1/workflows",
            json={"question": "6 * 7", "callback_url": "https://hooks.example.com/x"},
        )
        bad_url = http.post("/v1/workflows", json={"question": "6 * 7", "callback_url": "ftp://x"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "callback_url"
    assert "signing secret" in refused.json()["error"]["message"]
    assert bad_url.status_code == 400
    assert "http or https URL" in bad_url.json()["error"]["message"]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",  # cloud metadata
        "http://10.1.2.3/hooks",
        "http://[fd00::1]:8080/hooks",
        "http://0x7f.1:8080/hooks",  # 127.0.0.1, as a connection would read it
        "http://127.0.0.1./hooks",  # a trailing dot: still an address
        "http://10.1.2.3../hooks",
        "http://[fe80::1%25eth0]/hooks",  # an IPv6 zone (RFC 6874): judged without it
        "http://[::1%25lo]:8080/hooks",
    ],
)
def test_a_callback_to_an_internal_address_is_refused_naming_callback_url(
    api: Api, url: str
) -> None:
    engine = api.server.service.engine
    made = create_key(engine, "acme")
    set_webhook(engine, made.key.id, None)  # it signs: the address is what is refused
    job = {"question": "6 * 7", "callback_url": url}
    with api.http(made.secret) as http:
        refused = http.post("/v1/workflows", json=job)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "callback_url"
    assert error["message"].startswith("callback_url: ")
    assert "not a public address" in error["message"]
    assert ALLOWED in error["message"]


def test_a_loopback_receiver_gets_deliveries_only_once_loopback_is_allowed(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = api.server.service.engine
    made = create_key(engine, "acme")
    _, secret = set_webhook(engine, made.key.id, None)
    assert secret is not None
    receiver = WebhookReceiver(secret)
    job = {"question": "What is 6 * 7?", "callback_url": receiver.url}
    auth = {"Authorization": f"Bearer {made.secret}"}
    try:
        with httpx.Client(base_url=api.url, headers=auth) as http:
            monkeypatch.delenv(ALLOWED, raising=False)
            refused = http.post("/v1/workflows", json=job)
            monkeypatch.setenv(ALLOWED, "10.0.0.0/8, 127.0.0.0/8")
            accepted = http.post("/v1/workflows", json=job)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "callback_url"
        assert accepted.status_code == 202
        assert receiver.arrived.wait(30), f"no delivery; attempts: {receiver.attempts}"
    finally:
        receiver.close()
    assert len(receiver.delivered) == 1


def test_a_callback_to_a_name_of_an_internal_address_is_refused_when_sent(
    api: Api, receiver_and_key: tuple[WebhookReceiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job whose callback names its host: names are not looked up when a job is taken
    receiver, key = receiver_and_key
    monkeypatch.delenv(ALLOWED)
    url = receiver.url.replace("127.0.0.1", "localhost")
    job = {"question": "What is 6 * 7?", "callback_url": url}
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"}) as http:
        accepted = http.post("/v1/workflows", json=job)
    assert accepted.status_code == 202

    # When its outcome is sent, Then the sender refuses the address the name resolves to, once
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        deliveries = _deliveries(api, accepted.json()["id"])
        if deliveries and deliveries[0]["status"] != "pending":
            break
        time.sleep(0.1)
    [delivery] = _deliveries(api, accepted.json()["id"])
    assert delivery["status"] == "failed"
    [refusal] = delivery["attempts"]
    assert refusal["error"] == (
        "refused: localhost resolves to 127.0.0.1, which is not a public address; "
        f"allow it with {ALLOWED}"
    )
    assert receiver.attempts == []


def _sqlite_key(tmp_path: Path) -> tuple[Engine, str, str]:
    """A migrated SQLite database and a key with a signing secret: its id and the secret."""
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    upgrade(url)
    engine = make_engine(url)
    made = create_key(engine, "acme")
    _, secret = set_webhook(engine, made.key.id, None)
    assert secret is not None
    return engine, made.key.id, secret


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_url_accepted_while_its_network_was_allowed_is_refused_once_it_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    # Given a key's webhook URL set while loopback was allowed (or a name that resolved
    # elsewhere then: the check that counts is the one when it is sent)
    engine, key_id, secret = _sqlite_key(tmp_path)
    receiver = WebhookReceiver(secret)
    monkeypatch.setenv(ALLOWED, "127.0.0.0/8")
    set_webhook(engine, key_id, receiver.url.replace("127.0.0.1", host))
    delivery_id = _finished_job(engine, key_id)
    monkeypatch.delenv(ALLOWED)
    try:
        # When it is sent
        with httpx.Client() as client:
            now = utcnow()
            assert claim_due(engine, now) == [delivery_id]
            status = attempt(engine, delivery_id, client, now)
            later = claim_due(engine, now + timedelta(days=1))
        with engine.connect() as conn:
            row = conn.execute(select(webhook_delivery_table)).mappings().one()
    finally:
        receiver.close()
        engine.dispose()

    # Then nothing is sent, the attempt says why, and it is not tried again
    assert status == "failed"
    assert receiver.attempts == []
    assert later == []
    [refusal] = row["attempts"]
    resolved = "localhost resolves to 127.0.0.1, which" if host == "localhost" else "127.0.0.1"
    assert refusal["error"] == (
        f"refused: {resolved} is not a public address; allow it with {ALLOWED}"
    )


def test_a_delivery_by_name_goes_to_the_checked_address_with_its_host_header(
    tmp_path: Path,
) -> None:
    engine, key_id, secret = _sqlite_key(tmp_path)
    receiver = WebhookReceiver(secret)
    port = receiver.server.server_address[1]
    set_webhook(engine, key_id, f"http://localhost:{port}/hooks/conductor")
    delivery_id = _finished_job(engine, key_id)
    try:
        with httpx.Client() as client:
            status = attempt(engine, delivery_id, client, allowed=LOOPBACK)
    finally:
        receiver.close()
        engine.dispose()
    assert status == "delivered"
    [headers] = receiver.attempts
    assert headers["host"] == f"localhost:{port}"
    assert receiver.rejected == []  # the signature covers the body as sent


def test_a_redirect_is_not_followed_even_by_a_client_that_follows_them(
    tmp_path: Path, allow_loopback: None
) -> None:
    engine, key_id, secret = _sqlite_key(tmp_path)
    inside = WebhookReceiver(secret)  # where the redirect points: never reached
    receiver = WebhookReceiver(secret, redirect_to=inside.url)
    set_webhook(engine, key_id, receiver.url)
    delivery_id = _finished_job(engine, key_id)
    try:
        with httpx.Client(follow_redirects=True) as client:
            status = attempt(engine, delivery_id, client)
        with engine.connect() as conn:
            row = conn.execute(select(webhook_delivery_table)).mappings().one()
    finally:
        receiver.close()
        inside.close()
        engine.dispose()
    assert status == "pending"  # a 3xx is not a delivery: tried again later, at the same URL
    assert [a["status_code"] for a in row["attempts"]] == [307]
    assert len(receiver.attempts) == 1
    assert inside.attempts == []


def test_a_receiver_that_fails_twice_gets_the_event_once_and_every_attempt_is_kept(
    tmp_path: Path, allow_loopback: None
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
