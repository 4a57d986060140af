"""Workflow outcomes delivered to webhooks: recorded with the outcome, signed as Standard
Webhooks specifies (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``), retried with
backoff, every attempt kept.

A delivery row is written in the transaction that stores a workflow's outcome, so no outcome
is left undelivered. Senders claim due deliveries with a lease (``claim_due``): a sender that
dies mid-delivery leaves its lease to expire and another sends it again. Delivery is therefore
at least once: a receiver that saw a ``webhook-id`` before may ignore it.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlparse

import httpx
from sqlalchemy import Connection, Engine, insert, select, update
from standardwebhooks import Webhook

from conductor.errors import InvalidRequest
from conductor.workflow import WorkflowRecord
from conductor_adapters.store.models import (
    api_key_table,
    webhook_delivery_table,
    workflow_table,
)

# Seconds before the 2nd, 3rd, ... attempt; after the last, the delivery has failed.
BACKOFF_S = (1.0, 5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)
MAX_ATTEMPTS = len(BACKOFF_S) + 1
LEASE_S = 60.0  # a claimed delivery is not handed to another sender for this long
TIMEOUT_S = 10.0  # one attempt's HTTP timeout
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def check_url(url: str, param: str) -> str:
    """An http(s) URL with a host, or InvalidRequest naming ``param``."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or len(url) > 2048:
        message = f"{param}: expected an http or https URL, not {url[:100]!r}"
        raise InvalidRequest(message, param=param)
    return url


def new_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes, base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def record_delivery(conn: Connection, result: WorkflowRecord, when: datetime) -> str | None:
    """In the transaction that stores ``result``'s outcome: a delivery of it to the job's
    callback URL, else its key's webhook URL; None when it has neither, or its key no
    signing secret (nothing unsigned is ever sent)."""
    workflow, key = workflow_table, api_key_table
    target = conn.execute(
        select(
            workflow.c.tenant,
            workflow.c.key_id,
            workflow.c.labels,
            workflow.c.callback_url,
            key.c.webhook_url,
            key.c.webhook_secret,
        )
        .select_from(workflow.outerjoin(key, key.c.id == workflow.c.key_id))
        .where(workflow.c.id == result.workflow_id)
    ).first()
    if target is None:
        return None
    url = target.callback_url or target.webhook_url
    if not url or not target.webhook_secret:
        return None
    delivery_id = f"msg_{uuid.uuid4().hex}"
    event_type = f"workflow.{result.status.value}"
    conn.execute(
        insert(webhook_delivery_table).values(
            id=delivery_id,
            workflow_id=result.workflow_id,
            tenant=target.tenant,
            key_id=target.key_id,
            url=url,
            event_type=event_type,
            payload=_payload(result, event_type, target.labels, when),
            status=PENDING,
            attempts=[],
            next_attempt_at=when,
            created_at=when,
        )
    )
    return delivery_id


def _payload(
    result: WorkflowRecord, event_type: str, labels: dict[str, str], when: datetime
) -> dict[str, Any]:
    usage = result.usage
    return {
        "type": event_type,
        "timestamp": when.isoformat(),
        "data": {
            "workflow_id": str(result.workflow_id),
            "status": result.status.value,
            "variant": result.variant,
            "answer": result.answer,
            "error": result.error,
            "metadata": labels,
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
            "cost_usd": result.cost_usd,
            "latency_ms": result.latency_ms,
        },
    }


def claim_due(engine: Engine, now: datetime | None = None, limit: int = 50) -> list[str]:
    """Pending deliveries due now, each leased to the caller for ``LEASE_S``."""
    now = now or datetime.now(UTC)
    table = webhook_delivery_table
    due = (
        select(table.c.id)
        .where(table.c.status == PENDING, table.c.next_attempt_at <= now)
        .order_by(table.c.next_attempt_at)
        .limit(limit)
    )
    if engine.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)  # senders never claim the same one
    with engine.begin() as conn:
        ids = list(conn.execute(due).scalars())
        if ids:
            leased = now + timedelta(seconds=LEASE_S)
            conn.execute(update(table).where(table.c.id.in_(ids)).values(next_attempt_at=leased))
    return ids


def attempt(
    engine: Engine, delivery_id: str, client: httpx.Client, now: datetime | None = None
) -> str:
    """One attempt at a delivery: POST it, signed; record the attempt; schedule the next one
    or settle it. Returns its status afterwards."""
    table, key = webhook_delivery_table, api_key_table
    with engine.connect() as conn:
        row = conn.execute(
            select(table, key.c.webhook_secret)
            .select_from(table.outerjoin(key, key.c.id == table.c.key_id))
            .where(table.c.id == delivery_id)
        ).first()
    if row is None or row.status != PENDING:
        return DELIVERED if row is None else str(row.status)
    now = now or datetime.now(UTC)
    record: dict[str, Any] = {"at": now.isoformat()}
    delivered = False
    if not row.webhook_secret:
        record["error"] = "the key's signing secret was removed"
    else:
        body = json.dumps(row.payload, separators=(",", ":"))
        headers = {
            "webhook-id": delivery_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(row.webhook_secret).sign(delivery_id, now, body),
            "content-type": "application/json",
            "user-agent": "conductor-webhooks/1",
        }
        started = time.perf_counter()
        try:
            reply = client.post(row.url, content=body, headers=headers, timeout=TIMEOUT_S)
            record["status_code"] = reply.status_code
            delivered = 200 <= reply.status_code < 300
        except httpx.HTTPError as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
        record["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
    attempts = [*row.attempts, record]
    if delivered:
        values: dict[str, Any] = {"status": DELIVERED, "delivered_at": now, "next_attempt_at": None}
    elif len(attempts) >= MAX_ATTEMPTS or not row.webhook_secret:
        values = {"status": FAILED, "next_attempt_at": None}
    else:
        values = {"next_attempt_at": now + timedelta(seconds=BACKOFF_S[len(attempts) - 1])}
    with engine.begin() as conn:
        conn.execute(
            update(table)
            .where(table.c.id == delivery_id, table.c.status == PENDING)
            .values(attempts=attempts, **values)
        )
    return str(values.get("status", PENDING))
