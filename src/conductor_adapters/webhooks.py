"""Workflow outcomes delivered to webhooks: recorded with the outcome, signed as Standard
Webhooks specifies (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``), retried with
backoff, every attempt kept.

A delivery row is written in the transaction that stores a workflow's outcome, so no outcome
is left undelivered. Senders claim due deliveries with a lease (``claim_due``): a sender that
dies mid-delivery leaves its lease to expire and another sends it again. Delivery is therefore
at least once: a receiver that saw a ``webhook-id`` before may ignore it.

Webhook URLs come from tenants, so they reach public addresses only (besides the networks
CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS allows): otherwise a key holder could make the service POST
to its own network (cloud metadata at 169.254.169.254, databases, admin ports). An address is
refused when a URL is accepted (``check_url``) and again, after resolving its host, when it is
sent (``attempt``).
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, Connection, Engine, Row, bindparam, insert, select, update
from standardwebhooks import Webhook

from conductor.errors import InvalidRequest
from conductor.workflow import WorkflowRecord
from conductor_adapters.settings import WebhookSettings, load_settings
from conductor_adapters.store.models import (
    api_key_table,
    webhook_delivery_table,
    workflow_table,
)
from conductor_adapters.store.redact import without_addresses

# Seconds before the 2nd, 3rd, ... attempt; after the last, the delivery has failed.
BACKOFF_S = (1.0, 5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)
MAX_ATTEMPTS = len(BACKOFF_S) + 1
LEASE_S = 60.0  # a claimed delivery is not handed to another sender for this long
TIMEOUT_S = 10.0  # one attempt's HTTP timeout
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


Network = IPv4Network | IPv6Network
Address = IPv4Address | IPv6Address
ALLOW_HINT = "allow it with CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS"
_NAT64 = ip_network("64:ff9b::/96")  # well-known prefix: the last 32 bits are an IPv4 address
_LOCAL_NAT64 = ip_network("64:ff9b:1::/48")  # local use: what it embeds is the network's choice
# IPv6 ranges Python may call global that lead inside: IPv4-compatible (deprecated), SIIT's
# IPv4-translated, site-local (deprecated, still routed on some networks).
_NOT_PUBLIC_V6 = (ip_network("::/96"), ip_network("::ffff:0:0:0/96"), ip_network("fec0::/10"))
MAX_ADDRESSES = 3  # a host's addresses tried at most, so an attempt stays within its lease


class Refused(Exception):
    """A webhook's host is, or resolves to, an address webhooks may not reach."""


def allowed_networks() -> tuple[Network, ...]:
    """CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS as this process's environment says now (a bad value
    is a ConfigurationError naming it). Read where it is used rather than passed down: the
    API, the aggregators and `conductor keys webhook` all check with it (a read: ~0.2 ms)."""
    return load_settings(WebhookSettings).webhook_allowed_networks


def reachable(address: Address, allowed: Sequence[Network]) -> bool:
    """Whether webhooks may reach ``address``: a public one, or one in ``allowed``. An IPv6
    address that stands for an IPv4 one (mapped, 6to4, NAT64) is judged as the IPv4 one,
    which is where packets to it go."""
    if any(address in network for network in allowed):
        return True
    if isinstance(address, IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if address in _NAT64:
            inner = IPv4Address(int(address) & 0xFFFF_FFFF)
        if inner is not None:
            return reachable(inner, allowed)
        if address in _LOCAL_NAT64 or any(address in net for net in _NOT_PUBLIC_V6):
            return False
    return address.is_global and not address.is_multicast


def _literal(host: str) -> Address | None:
    """The address ``host`` spells, in any form a connection would read it (``127.1`` and
    ``2130706433`` are 127.0.0.1); None for a name. No lookup: AI_NUMERICHOST. An IPv6 zone
    (``fe80::1%25eth0``, RFC 6874) is judged without it, as the address it scopes, and a
    trailing dot (``127.0.0.1.``) is the root of the DNS: an address all the same."""
    address = host.replace("%25", "%").split("%", 1)[0].rstrip(".")
    try:  # bytes: a str host would go through the idna codec, which refuses some names
        found = socket.getaddrinfo(address.encode("ascii"), None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeEncodeError):
        return None
    return ip_address(found[0][4][0])


def check_url(url: str, param: str, allowed: Sequence[Network] | None = None) -> str:
    """An http(s) URL with a host that is not an address webhooks may not reach, or
    InvalidRequest naming ``param``. ``allowed``: networks reachable although not public
    (default: the setting).

    A name is not resolved here: that would put a DNS lookup in the request path, and what a
    name resolves to now says nothing of what it resolves to when the webhook is sent (DNS
    rebinding). The sender checks every address the name has then."""
    try:  # parsed as the sender parses it: no two parsers disagree about where it goes
        parsed: httpx.URL | None = httpx.URL(url)
    except httpx.InvalidURL:
        parsed = None
    if (
        parsed is None
        or parsed.scheme not in ("http", "https")
        or not parsed.raw_host
        or len(url) > 2048
    ):
        message = f"{param}: expected an http or https URL, not {url[:100]!r}"
        raise InvalidRequest(message, param=param)
    address = _literal(parsed.raw_host.decode("ascii"))
    if address is not None and not reachable(
        address, allowed_networks() if allowed is None else allowed
    ):
        raise InvalidRequest(
            f"{param}: {address} is not a public address, and webhooks reach only public ones "
            "unless an operator allows its network (CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS)",
            param=param,
        )
    return url


def new_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes, base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


# Where a workflow's outcome is delivered: its row's columns and its key's webhook. An UPDATE
# that ends the workflow returns them (``RETURNING``), a statement fewer than reading them.
DELIVERY_TARGET: tuple[ColumnElement[Any], ...] = (
    workflow_table.c.tenant,
    workflow_table.c.key_id,
    workflow_table.c.labels,
    workflow_table.c.callback_url,
    select(api_key_table.c.webhook_url)
    .where(api_key_table.c.id == workflow_table.c.key_id)
    .scalar_subquery()
    .label("webhook_url"),
    select(api_key_table.c.webhook_secret)
    .where(api_key_table.c.id == workflow_table.c.key_id)
    .scalar_subquery()
    .label("webhook_secret"),
)
_DELIVERY_TARGET = select(*DELIVERY_TARGET).where(workflow_table.c.id == bindparam("workflow"))


def record_delivery(
    conn: Connection, result: WorkflowRecord, when: datetime, target: Row[Any] | None = None
) -> str | None:
    """In the transaction that stores ``result``'s outcome: a delivery of it to the job's
    callback URL, else its key's webhook URL; None when it has neither, or its key no
    signing secret (nothing unsigned is ever sent). ``target``: its ``DELIVERY_TARGET``
    columns as the statement that ended it returned them (else they are read)."""
    if target is None:
        target = conn.execute(_DELIVERY_TARGET, {"workflow": result.workflow_id}).first()
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
            # As the API shows it: the receiver is the tenant's, the addresses are not.
            "error": None if result.error is None else without_addresses(result.error),
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
    engine: Engine,
    delivery_id: str,
    client: httpx.Client,
    now: datetime | None = None,
    *,
    allowed: Sequence[Network] | None = None,
) -> str:
    """One attempt at a delivery: POST it, signed; record the attempt; schedule the next one
    or settle it. Returns its status afterwards. ``allowed``: networks reachable although not
    public (default: the setting); a URL whose host is or resolves to an address outside them
    is refused, and the delivery fails at once (the attempt says why): trying again would not
    change the answer, only keep asking."""
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
    delivered = refused = False
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
        networks = allowed_networks() if allowed is None else allowed
        try:
            reply = _post_pinned(client, row.url, body, headers, networks)
            record["status_code"] = reply.status_code
            delivered = 200 <= reply.status_code < 300
        except Refused as exc:
            record["error"], refused = f"refused: {exc}", True
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:  # OSError: no address
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
        record["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
    attempts = [*row.attempts, record]
    if delivered:
        values: dict[str, Any] = {"status": DELIVERED, "delivered_at": now, "next_attempt_at": None}
    elif refused or len(attempts) >= MAX_ATTEMPTS or not row.webhook_secret:
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


def _post_pinned(
    client: httpx.Client,
    url: str,
    body: str,
    headers: dict[str, str],
    allowed: Sequence[Network],
) -> httpx.Response:
    """POST to ``url`` at an address checked here: the host is resolved once, every address it
    has must be reachable (else Refused), and the request goes to a checked address itself.
    Connecting by name would look the name up again, and a name that answered a public
    address to the check can answer a private one to the connection (DNS rebinding).

    httpx takes no resolver (a transport's options are its local address, retries and a Unix
    socket), so the URL names the address, the Host header the host, and TLS sends and
    verifies the name (httpcore's ``sni_hostname`` extension). That works with any client,
    whoever built it. Redirects are never followed: their target would go unchecked."""
    target = httpx.URL(url)
    host = target.raw_host.decode("ascii")
    by_name = _literal(host) is None
    port = target.port or (443 if target.scheme == "https" else 80)
    found = socket.getaddrinfo(target.raw_host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(ip_address(info[4][0]) for info in found))
    for address in addresses:
        if not reachable(address, allowed):
            what = f"{host} resolves to {address}, which" if by_name else str(address)
            raise Refused(f"{what} is not a public address; {ALLOW_HINT}")
    pinned = {**headers, "host": target.netloc.decode("ascii")}
    extensions: dict[str, Any] = {}
    if target.scheme == "https":
        if by_name:
            extensions["sni_hostname"] = host
        # The pool keys connections by address, not by the name TLS verified: none is left
        # for a delivery to another name at the same address to reuse.
        pinned["connection"] = "close"

    def send(address: Address) -> httpx.Response:
        return client.post(
            target.copy_with(host=str(address)),
            content=body,
            headers=pinned,
            extensions=extensions,
            timeout=TIMEOUT_S,
            follow_redirects=False,
        )

    *others, last = addresses[:MAX_ADDRESSES]
    for address in others:
        try:
            return send(address)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            continue  # the next address, as a connection by name would try it
    return send(last)


class DeliveryView(BaseModel):
    """A webhook delivery as its tenant reads it: where it goes, how it stands, every attempt
    (``{at, status_code, error, duration_ms}``, oldest first)."""

    id: str = Field(description="The webhook-id header every attempt carries.")
    object: Literal["webhook.delivery"] = "webhook.delivery"
    url: str
    event_type: str
    status: Literal["pending", "delivered", "failed"]
    attempts: list[dict[str, Any]]
    next_attempt_at: datetime | None
    created_at: datetime
    delivered_at: datetime | None


def load_deliveries(engine: Engine, workflow_id: uuid.UUID, tenant: str) -> list[DeliveryView]:
    """The deliveries of the tenant's workflow, oldest first (none for another tenant's)."""
    table = webhook_delivery_table
    with engine.connect() as conn:
        rows = conn.execute(
            select(table)
            .where(table.c.workflow_id == workflow_id, table.c.tenant == tenant)
            .order_by(table.c.created_at, table.c.id)
        ).mappings()
        return [DeliveryView.model_validate(dict(row)) for row in rows]
