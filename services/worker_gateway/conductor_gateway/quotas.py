"""Per-worker quotas: requests per minute, tokens per minute, calls in flight.

Every provider call takes a lease before it starts: one request in the RPM window, an estimate
of its tokens in the TPM window, and a concurrency slot. After the call the lease is settled:
the estimate is replaced by the real count and the slot is freed. A call over quota waits for
room (never dropped). Windows slide (any 60 s span, not clock minutes), so a provider counting
its own way never sees a burst at a minute boundary.

Waiting calls take their turn fairly between tenants (start-time fair queueing): each waiting
call gets a tag, one more than the later of its tenant's last tag and the tag of the last call
let through, and room goes to the lowest tags first (ties: first come). So a tenant with a
hundred calls waiting queues behind itself, and another tenant's first call is next in line.

Two stores implement the same rules: ``MemoryQuotas`` for one process (embedded mode) and
``RedisQuotas`` (quotas_redis.py), shared by every gateway replica, each check-and-take one
atomic Lua script.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from conductor.chat import ChatMessage, ToolUse
from conductor.pool import Quotas

MAX_POLL_S = 0.25  # how often a call waiting for a concurrency slot looks again
# The first in line looks again this soon at the latest while others wait behind it: room can
# come before its hint says (calls settle below their estimates), and nobody may pass it.
HEAD_POLL_S = 2.0
# What an image may cost before the real count is known: about what a large one costs at
# Anthropic (1,600) and OpenAI at high detail.
IMAGE_TOKENS = 1600


@dataclass(frozen=True)
class QuotaConfig:
    window_s: float = 60.0  # "per minute"; tests shorten it
    # Requests reach the provider a little after we count them; each window entry is held this
    # much longer so the provider's own window never sees more than the limit.
    skew_s: float = 0.25
    # A concurrency slot whose holder stops renewing it (the process died) is freed after this.
    lease_s: float = 30.0
    # A waiting call that stops looking for room (its process died) loses its place in line
    # this long after its next look was due.
    wait_grace_s: float = 5.0

    @property
    def hold_s(self) -> float:
        return self.window_s + self.skew_s


class QuotaLease(Protocol):
    @property
    def waited_s(self) -> float:
        """Seconds the call waited for room under the quotas."""
        ...

    async def settle(self, tokens: int | None) -> None:
        """Record the call's real token count (None: keep the estimate) and free its slot."""


class QuotaStore(Protocol):
    async def acquire(
        self, worker: str, quotas: Quotas, tokens: int, tenant: str | None = None
    ) -> QuotaLease:
        """Wait until the call fits every limit and its turn among the waiting calls has come
        (fair between tenants; None is one tenant of its own), then take its share."""


def estimate_tokens(
    messages: Sequence[ChatMessage], max_tokens: int, tools: ToolUse | None = None
) -> int:
    """What a call may spend before its real count is known: the prompt (tools' schemas and
    calls included) at about four characters a token (plus a few per message), and the whole
    output budget."""
    prompt = sum(
        math.ceil((len(m.content) + sum(len(c.arguments) for c in m.tool_calls)) / 4)
        + 4
        + IMAGE_TOKENS * len(m.images)
        for m in messages
    )
    if tools is not None:
        prompt += math.ceil(len(tools.model_dump_json()) / 4)
    return prompt + max_tokens


def limited(quotas: Quotas) -> bool:
    return any(v is not None for v in (quotas.rpm, quotas.tpm, quotas.max_concurrency))


def new_lease_id() -> str:
    """Unique, and in order of creation (the time first): ties in the fair order go to the call
    that came first."""
    return f"{time.time_ns():016x}{uuid.uuid4().hex[:12]}"


def reserve(quotas: Quotas, tokens: int) -> int:
    # A call larger than the whole TPM budget would never fit: it reserves the whole window.
    return min(tokens, quotas.tpm) if quotas.tpm else tokens


async def wait_a_little(seconds: float) -> None:
    """Sleep for a quota hint, jittered so waiting callers do not wake in lockstep."""
    await asyncio.sleep(max(0.005, seconds) * random.uniform(1.0, 1.2))


@dataclass
class _Waiter:
    tag: int
    lease_id: str
    tenant: str
    tokens: int

    @property
    def order(self) -> tuple[int, str]:
        return self.tag, self.lease_id


@dataclass
class _Window:
    """One worker's state in memory: the same rules as the Lua script."""

    requests: deque[float] = field(default_factory=deque)
    tokens: dict[str, tuple[float, int]] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    # Per tenant with calls waiting: its last tag, and how many of its calls wait.
    last_tag: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    virtual_tag: int = 0  # the tag of the last call let through

    def join(self, lease_id: str, tenant: str, tokens: int) -> _Waiter:
        waiter = self.waiters.get(lease_id)
        if waiter is None:
            tag = max(self.virtual_tag, self.last_tag.get(tenant, 0)) + 1
            waiter = self.waiters[lease_id] = _Waiter(tag, lease_id, tenant, tokens)
            self.last_tag[tenant] = tag
            self.waiting[tenant] = self.waiting.get(tenant, 0) + 1
        return waiter

    def leave(self, lease_id: str) -> None:
        waiter = self.waiters.pop(lease_id, None)
        if waiter is None:
            return
        self.waiting[waiter.tenant] -= 1
        if not self.waiting[waiter.tenant]:  # its next call starts level with the others
            del self.waiting[waiter.tenant], self.last_tag[waiter.tenant]

    def ahead_of(self, waiter: _Waiter) -> list[_Waiter]:
        return sorted(
            (w for w in self.waiters.values() if w.order < waiter.order), key=lambda w: w.order
        )


class MemoryQuotas:
    """Quotas for one process. Thread-safe, so one store can serve several event loops."""

    def __init__(self, config: QuotaConfig | None = None) -> None:
        self.config = config or QuotaConfig()
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    async def acquire(
        self, worker: str, quotas: Quotas, tokens: int, tenant: str | None = None
    ) -> QuotaLease:
        if not limited(quotas):
            return FREE_LEASE
        lease_id, tokens = new_lease_id(), reserve(quotas, tokens)
        started = time.monotonic()
        try:
            while True:
                wait = self._try_take(worker, quotas, lease_id, tokens, tenant or "")
                if wait is None:
                    return _MemoryLease(self, worker, lease_id, time.monotonic() - started)
                await wait_a_little(wait)
        except BaseException:
            with self._lock:  # a call that stops waiting (cancelled) leaves the line
                window = self._windows.get(worker)
                if window is not None:
                    window.leave(lease_id)
            raise

    def _try_take(
        self, worker: str, quotas: Quotas, lease_id: str, tokens: int, tenant: str
    ) -> float | None:
        hold = self.config.hold_s
        with self._lock:
            window = self._windows.setdefault(worker, _Window())
            waiter = window.join(lease_id, tenant, tokens)
            now = time.monotonic()
            while window.requests and window.requests[0] <= now - hold:
                window.requests.popleft()
            for key in [k for k, (at, _) in window.tokens.items() if at <= now - hold]:
                del window.tokens[key]
            wait = 0.0
            if quotas.rpm and len(window.requests) >= quotas.rpm:
                wait = max(wait, window.requests[0] + hold - now)
            if quotas.tpm:
                wait = max(wait, _tokens_wait(window, quotas.tpm, tokens, now, hold))
            if quotas.max_concurrency and len(window.in_flight) >= quotas.max_concurrency:
                wait = max(wait, MAX_POLL_S)
            if wait == 0 and not _room_for_those_ahead(window, quotas, waiter):
                wait = MAX_POLL_S  # the calls ahead in line go first
            if wait > HEAD_POLL_S and len(window.waiters) > 1 and not window.ahead_of(waiter):
                wait = HEAD_POLL_S
            if wait > 0:
                return wait
            window.leave(lease_id)
            window.virtual_tag = max(window.virtual_tag, waiter.tag)
            if quotas.rpm:
                window.requests.append(now)
            if quotas.tpm:
                window.tokens[lease_id] = (now, tokens)
            if quotas.max_concurrency:
                window.in_flight.add(lease_id)
            return None

    def _settle(self, worker: str, lease_id: str, tokens: int | None) -> None:
        with self._lock:
            window = self._windows[worker]
            window.in_flight.discard(lease_id)
            if tokens is not None and lease_id in window.tokens:
                window.tokens[lease_id] = (window.tokens[lease_id][0], tokens)


def _room_for_those_ahead(window: _Window, quotas: Quotas, waiter: _Waiter) -> bool:
    """Whether the calls waiting ahead of ``waiter`` fit beside it: if not, they go first."""
    ahead = window.ahead_of(waiter)
    if not ahead:
        return True
    if quotas.rpm and len(window.requests) + len(ahead) >= quotas.rpm:
        return False
    if quotas.max_concurrency and len(window.in_flight) + len(ahead) >= quotas.max_concurrency:
        return False
    if quotas.tpm:
        used = sum(count for _, count in window.tokens.values())
        return used + sum(w.tokens for w in ahead) + waiter.tokens <= quotas.tpm
    return True


def _tokens_wait(window: _Window, tpm: int, tokens: int, now: float, hold: float) -> float:
    """Seconds until enough of the oldest reservations leave the window for ``tokens``."""
    used = sum(count for _, count in window.tokens.values())
    excess = used + tokens - tpm
    if excess <= 0:
        return 0.0
    for at, count in sorted(window.tokens.values()):
        excess -= count
        if excess <= 0:
            return at + hold - now
    return hold


@dataclass
class _MemoryLease:
    store: MemoryQuotas
    worker: str
    lease_id: str
    waited_s: float

    async def settle(self, tokens: int | None) -> None:
        self.store._settle(self.worker, self.lease_id, tokens)


@dataclass(frozen=True)
class _FreeLease:
    """The lease of a worker with no limits: nothing to wait for, nothing to record."""

    waited_s: float = 0.0

    async def settle(self, tokens: int | None) -> None:
        return None


FREE_LEASE = _FreeLease()
