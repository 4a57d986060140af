"""Per-worker quotas (RPM, TPM, concurrency) on both stores: MemoryQuotas and RedisQuotas.

The same behavioural tests run on each store; the Redis-only ones cover what only a shared
store has (several processes, leases that lapse or are renewed, key TTLs). Real Redis only:
windows are shortened to under two seconds so the whole file runs in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis

from conductor.chat import ChatMessage
from conductor.pool import Quotas
from conductor_gateway.quotas import (
    FREE_LEASE,
    MAX_POLL_S,
    MemoryQuotas,
    QuotaConfig,
    QuotaLease,
    QuotaStore,
    estimate_tokens,
    limited,
    reserve,
)
from conductor_gateway.quotas_redis import RedisQuotas, _RedisLease

# Quotas are windows and leases in real time: the tests wait them out.
pytestmark = [pytest.mark.slow]

WORKER = "worker-a"


@dataclass
class Stores:
    """Builds quota stores of one kind; Redis clients it opens are closed at teardown."""

    kind: str
    redis_url: str | None = None
    prefix: str = ""
    clients: list[aioredis.Redis] = field(default_factory=list)

    def client(self) -> aioredis.Redis:
        assert self.redis_url is not None
        client = aioredis.Redis.from_url(self.redis_url)
        self.clients.append(client)
        return client

    def make(self, config: QuotaConfig) -> QuotaStore:
        if self.kind == "memory":
            return MemoryQuotas(config)
        return RedisQuotas(self.client(), prefix=self.prefix, config=config)

    async def keys(self) -> list[bytes]:
        """Every Redis key under this test's prefix (none for the memory store)."""
        if self.kind == "memory":
            return []
        return await scan_keys(self.client(), self.prefix)

    async def close(self) -> None:
        await stop_renewers()
        for client in self.clients:
            await client.aclose()


async def stop_renewers() -> None:
    """Stop lease renewals a failed test left running, so teardown reports instead of hanging.

    A cancel that lands while a renewal call is in flight can be lost (see
    test_settle_returns_even_when_it_lands_during_a_renewal), so cancel until it takes.
    """
    renewers = [
        task
        for task in asyncio.all_tasks()
        if task.get_coro().__qualname__ == "_RedisLease._renew_forever"  # type: ignore[union-attr]
    ]
    for _ in range(200):
        running = [task for task in renewers if not task.done()]
        if not running:
            return
        for task in running:
            task.cancel()
        await asyncio.sleep(0.01)


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    if request.param == "memory":
        built = Stores("memory")
    else:
        built = Stores(
            "redis",
            redis_url=request.getfixturevalue("redis_url"),
            prefix=request.getfixturevalue("redis_prefix"),
        )
    try:
        yield built
    finally:
        await built.close()


@pytest.fixture
async def redis_stores(redis_url: str, redis_prefix: str) -> AsyncIterator[Stores]:
    built = Stores("redis", redis_url=redis_url, prefix=redis_prefix)
    try:
        yield built
    finally:
        await built.close()


async def scan_keys(client: aioredis.Redis, prefix: str) -> list[bytes]:
    return [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]


def most_in_any_span(times: list[float], span_s: float) -> int:
    """The largest number of ``times`` inside any half-open span [t, t + span_s)."""
    ordered = sorted(times)
    return max(
        (
            sum(1 for later in ordered[i:] if later - start < span_s)
            for i, start in enumerate(ordered)
        ),
        default=0,
    )


async def settle_all(leases: list[QuotaLease], tokens: int | None = None) -> None:
    for lease in leases:
        await lease.settle(tokens)


async def acquire_timed(
    store: QuotaStore, worker: str, quotas: Quotas, tokens: int, times: list[float]
) -> QuotaLease:
    lease = await store.acquire(worker, quotas, tokens)
    times.append(time.monotonic())
    return lease


# -- the same rules on both stores ----------------------------------------------------------


async def test_rpm_never_lets_more_than_the_limit_into_any_window(stores: Stores) -> None:
    # Given a worker allowed 3 requests in any 0.6 s span
    window_s = 0.6
    store = stores.make(QuotaConfig(window_s=window_s, skew_s=0.1, lease_s=1.0))
    quotas = Quotas(rpm=3)
    times: list[float] = []

    # When 7 calls ask at once
    leases = await asyncio.wait_for(
        asyncio.gather(*(acquire_timed(store, WORKER, quotas, 10, times) for _ in range(7))),
        timeout=10,
    )

    # Then every call gets through, never more than 3 in any window, and the later ones waited
    assert len(leases) == 7
    assert most_in_any_span(times, window_s) <= 3, sorted(times)
    waited = sorted(lease.waited_s for lease in leases)
    assert all(w < 0.2 for w in waited[:3]), waited
    assert all(w > window_s * 0.8 for w in waited[3:6]), waited
    assert waited[6] > 2 * window_s * 0.8, waited
    await settle_all(leases)


async def test_concurrency_never_exceeds_max_and_every_call_completes(stores: Stores) -> None:
    # Given a worker allowed 2 calls in flight
    store = stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=1.0))
    quotas = Quotas(max_concurrency=2)
    in_flight = peak = done = 0

    async def call() -> None:
        nonlocal in_flight, peak, done
        lease = await store.acquire(WORKER, quotas, 10)
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.1)
        in_flight -= 1  # counted out before the slot is freed: the count never undercounts
        await lease.settle(8)
        done += 1

    # When 6 calls, each holding its lease 0.1 s, start at once
    await asyncio.wait_for(asyncio.gather(*(call() for _ in range(6))), timeout=10)

    # Then all 6 completed and never more than 2 held a lease at the same time
    assert done == 6
    assert peak == 2


async def hold_in_turn(
    store: QuotaStore,
    quotas: Quotas,
    tenant: str,
    name: str,
    granted: list[str],
    hold_s: float,
) -> None:
    """One call: wait for its turn, note its name when let through, hold the lease."""
    lease = await store.acquire(WORKER, quotas, 10, tenant=tenant)
    granted.append(name)
    await asyncio.sleep(hold_s)
    await lease.settle(8)


async def test_another_tenants_call_does_not_queue_behind_a_busy_tenants(stores: Stores) -> None:
    # Given tenant A's 20 calls waiting for a worker allowed 2 at once, each holding it 0.15 s
    store = stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=5.0))
    quotas = Quotas(max_concurrency=2)
    granted: list[str] = []
    a_calls = [
        asyncio.create_task(hold_in_turn(store, quotas, "A", f"A{i}", granted, 0.15))
        for i in range(20)
    ]
    await asyncio.sleep(0.4)
    granted_before_b = len(granted)

    # When tenant B sends one call
    started = time.monotonic()
    await asyncio.wait_for(hold_in_turn(store, quotas, "B", "B", granted, 0.0), timeout=10)
    b_waited = time.monotonic() - started  # shown if it fails; timing is the API test's

    # Then B is let through within a few calls, not behind A's 14-odd waiting calls: at most
    # the two slots that may free while B joins the line, and the A call level with it
    assert granted.index("B") - granted_before_b <= 3, (granted, b_waited)
    # And A's calls all complete
    await asyncio.wait_for(asyncio.gather(*a_calls), timeout=20)
    assert sorted(int(name[1:]) for name in granted if name != "B") == list(range(20))


async def test_one_tenants_calls_are_let_through_in_the_order_they_came(stores: Stores) -> None:
    # Given a worker allowed 1 call at once, held by a first call
    store = stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=5.0))
    quotas = Quotas(max_concurrency=1)
    first = await store.acquire(WORKER, quotas, 10, tenant="A")
    granted: list[str] = []

    # When 6 more calls of the tenant arrive one after another, then the first settles
    waiting = []
    for i in range(6):
        waiting.append(
            asyncio.create_task(hold_in_turn(store, quotas, "A", f"A{i}", granted, 0.05))
        )
        await asyncio.sleep(0.02)
    await first.settle(8)
    await asyncio.wait_for(asyncio.gather(*waiting), timeout=10)

    # Then they were let through first come, first served
    assert granted == [f"A{i}" for i in range(6)]


async def test_tenants_take_turns_when_both_have_many_calls_waiting(stores: Stores) -> None:
    # Given a worker allowed 1 call at once, held, and 6 calls of A then 6 of B waiting
    store = stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=5.0))
    quotas = Quotas(max_concurrency=1)
    first = await store.acquire(WORKER, quotas, 10, tenant="A")
    granted: list[str] = []
    waiting = []
    for tenant in "AB":
        for i in range(6):
            call = hold_in_turn(store, quotas, tenant, f"{tenant}{i}", granted, 0.02)
            waiting.append(asyncio.create_task(call))
            await asyncio.sleep(0.01)

    # When the slot frees
    await first.settle(8)
    await asyncio.wait_for(asyncio.gather(*waiting), timeout=15)

    # Then the tenants alternate (A's first call came first), not A's six then B's six
    assert [name[0] for name in granted] == list("ABABABABABAB"), granted


async def test_a_cancelled_waiter_leaves_the_line_and_its_tenant_starts_level(
    stores: Stores,
) -> None:
    # Given a held slot, A's 5 calls waiting, then B's 3
    store = stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=5.0))
    quotas = Quotas(max_concurrency=1)
    first = await store.acquire(WORKER, quotas, 10, tenant="C")
    granted: list[str] = []
    a_calls = []
    for i in range(5):
        a_calls.append(
            asyncio.create_task(hold_in_turn(store, quotas, "A", f"A{i}", granted, 0.02))
        )
        await asyncio.sleep(0.01)
    b_calls = []
    for i in range(3):
        b_calls.append(
            asyncio.create_task(hold_in_turn(store, quotas, "B", f"B{i}", granted, 0.02))
        )
        await asyncio.sleep(0.01)

    # When A's calls are cancelled while they wait, A sends one more, and the slot frees
    for task in a_calls:
        task.cancel()
    await asyncio.gather(*a_calls, return_exceptions=True)
    late = asyncio.create_task(hold_in_turn(store, quotas, "A", "A-late", granted, 0.02))
    await asyncio.sleep(0.05)
    await first.settle(8)
    await asyncio.wait_for(asyncio.gather(*b_calls, late), timeout=10)

    # Then no cancelled call was let through, and A's new call was not put behind the tags of
    # its cancelled ones: it went second, after B's first
    assert granted == ["B0", "A-late", "B1", "B2"], granted


async def test_rpm_lets_another_tenant_into_the_next_window(stores: Stores) -> None:
    # Given rpm=2 in a 0.5 s window, and tenant A's 8 calls waiting on it
    store = stores.make(QuotaConfig(window_s=0.5, skew_s=0.02, lease_s=5.0))
    quotas = Quotas(rpm=2)
    granted: list[str] = []
    a_calls = [
        asyncio.create_task(hold_in_turn(store, quotas, "A", f"A{i}", granted, 0.0))
        for i in range(8)
    ]
    await asyncio.sleep(0.1)

    # When tenant B sends one call
    granted_before_b = len(granted)
    await asyncio.wait_for(hold_in_turn(store, quotas, "B", "B", granted, 0.0), timeout=10)

    # Then it is among the two calls of the next window
    assert granted.index("B") - granted_before_b <= 1, granted
    await asyncio.wait_for(asyncio.gather(*a_calls), timeout=10)


async def test_tpm_makes_the_call_that_does_not_fit_wait_for_the_window(stores: Stores) -> None:
    # Given tpm=100 and two calls of 40 tokens already in the window
    window_s = 0.8
    store = stores.make(QuotaConfig(window_s=window_s, skew_s=0.05, lease_s=1.0))
    quotas = Quotas(tpm=100)
    first = await store.acquire(WORKER, quotas, 40)
    second = await store.acquire(WORKER, quotas, 40)

    # When a third 40-token call asks (120 > 100)
    third = await asyncio.wait_for(store.acquire(WORKER, quotas, 40), timeout=5)

    # Then the first two got in at once and the third waited for the first to leave the window
    assert first.waited_s < 0.2
    assert second.waited_s < 0.2
    assert third.waited_s > window_s * 0.8
    await settle_all([first, second, third])


async def test_settling_with_the_real_count_frees_the_unused_estimate(stores: Stores) -> None:
    # Given tpm=100 and two calls that reserved 40 tokens each but really used 5
    store = stores.make(QuotaConfig(window_s=0.8, skew_s=0.05, lease_s=1.0))
    quotas = Quotas(tpm=100)
    first = await store.acquire(WORKER, quotas, 40)
    second = await store.acquire(WORKER, quotas, 40)
    await first.settle(5)
    await second.settle(5)

    # When a third 40-token call asks (5 + 5 + 40 <= 100)
    started = time.monotonic()
    third = await asyncio.wait_for(store.acquire(WORKER, quotas, 40), timeout=5)

    # Then it fits at once, long before the window would have freed the estimates
    assert time.monotonic() - started < 0.2
    assert third.waited_s < 0.2
    await third.settle(None)


async def test_settling_without_a_count_keeps_the_estimate(stores: Stores) -> None:
    # Given tpm=100 and two 40-token calls settled with no real count (None)
    window_s = 0.8
    store = stores.make(QuotaConfig(window_s=window_s, skew_s=0.05, lease_s=1.0))
    quotas = Quotas(tpm=100)
    first = await store.acquire(WORKER, quotas, 40)
    second = await store.acquire(WORKER, quotas, 40)
    await first.settle(None)
    await second.settle(None)

    # When a third 40-token call asks
    third = await asyncio.wait_for(store.acquire(WORKER, quotas, 40), timeout=5)

    # Then the estimates still count: it waited for the window
    assert third.waited_s > window_s * 0.8
    await third.settle(None)


async def test_a_call_larger_than_tpm_is_clamped_and_never_waits_forever(stores: Stores) -> None:
    # Given tpm=100 and calls estimated at 500 tokens each
    window_s = 0.5
    store = stores.make(QuotaConfig(window_s=window_s, skew_s=0.05, lease_s=1.0))
    quotas = Quotas(tpm=100)
    assert reserve(quotas, 500) == 100
    assert reserve(quotas, 30) == 30
    assert reserve(Quotas(rpm=5), 500) == 500  # no TPM limit: nothing to clamp to

    # When the first asks on an empty window, and a second one right after
    first = await asyncio.wait_for(store.acquire(WORKER, quotas, 500), timeout=2)
    second = await asyncio.wait_for(store.acquire(WORKER, quotas, 500), timeout=3)

    # Then the first got in at once (it reserves the whole window) and the second after it left
    assert first.waited_s < 0.2
    assert second.waited_s > window_s * 0.8
    await settle_all([first, second])


async def test_limits_of_one_worker_never_delay_another(stores: Stores) -> None:
    # Given worker "a" at every limit: its request, its tokens and its slot all taken
    window_s = 0.5
    store = stores.make(QuotaConfig(window_s=window_s, skew_s=0.05, lease_s=1.0))
    quotas = Quotas(rpm=1, tpm=50, max_concurrency=1)
    held_a = await store.acquire("a", quotas, 50)
    waiting_a = asyncio.create_task(store.acquire("a", quotas, 50))
    await asyncio.sleep(0.05)

    # When worker "b", with the same limits, asks
    started = time.monotonic()
    lease_b = await asyncio.wait_for(store.acquire("b", quotas, 50), timeout=2)
    elapsed = time.monotonic() - started

    # Then "b" gets in at once while "a" is still waiting
    assert elapsed < 0.2
    assert lease_b.waited_s < 0.2
    assert not waiting_a.done()
    await held_a.settle(None)
    second_a = await asyncio.wait_for(waiting_a, timeout=3)
    assert second_a.waited_s > window_s * 0.8
    await settle_all([lease_b, second_a])


async def test_no_limits_returns_at_once_and_writes_nothing(stores: Stores) -> None:
    # Given a worker with no quotas at all
    store = stores.make(QuotaConfig(window_s=0.5, skew_s=0.05, lease_s=1.0))
    quotas = Quotas()
    assert not limited(quotas)
    assert limited(Quotas(rpm=1))
    assert limited(Quotas(tpm=1))
    assert limited(Quotas(max_concurrency=1))

    # When 50 calls of a huge token count ask
    started = time.monotonic()
    leases = [await store.acquire(WORKER, quotas, 1_000_000) for _ in range(50)]
    elapsed = time.monotonic() - started

    # Then each returned the free lease at once, and nothing was recorded anywhere
    assert all(lease is FREE_LEASE for lease in leases)
    assert all(lease.waited_s == 0 for lease in leases)
    assert elapsed < 0.2
    await settle_all(leases, 123)
    assert await stores.keys() == []


# -- Redis only: several processes, leases, key lifetimes -----------------------------------


async def test_rpm_holds_across_several_gateway_processes(redis_stores: Stores) -> None:
    # Given 3 gateway processes, each with its own Redis client and store on the same prefix
    window_s = 1.0
    config = QuotaConfig(window_s=window_s, skew_s=0.1, lease_s=1.0)
    gateways = [redis_stores.make(config) for _ in range(3)]
    quotas = Quotas(rpm=4)
    times: list[float] = []

    # When 12 calls, spread over the 3 processes, ask at once
    leases = await asyncio.wait_for(
        asyncio.gather(
            *(acquire_timed(gateways[i % 3], WORKER, quotas, 10, times) for i in range(12))
        ),
        timeout=15,
    )

    # Then all complete and never more than 4 land in any 1 s span
    assert len(leases) == 12
    assert most_in_any_span(times, window_s) <= 4, sorted(times)
    await settle_all(leases)


async def test_a_dead_holders_slot_is_freed_after_the_lease(redis_stores: Stores) -> None:
    # Given a lease on the only slot whose holder died: renewal stopped, never settled
    lease_s = 1.0
    store = redis_stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=lease_s))
    quotas = Quotas(max_concurrency=1)
    dead = await store.acquire(WORKER, quotas, 10)
    assert isinstance(dead, _RedisLease)
    assert dead._renewer is not None
    dead._renewer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await dead._renewer

    # When another call asks for the slot
    started = time.monotonic()
    lease = await asyncio.wait_for(store.acquire(WORKER, quotas, 10), timeout=5)
    elapsed = time.monotonic() - started

    # Then it gets it once the dead lease has expired, about lease_s later
    assert 0.9 * lease_s <= elapsed <= 3 * lease_s, elapsed
    await lease.settle(None)


async def test_a_dead_holders_slot_is_freed_while_live_holders_keep_the_key(
    redis_stores: Stores,
) -> None:
    # Given two slots: one held by a live, renewing holder (its renewals keep the key itself
    # alive), the other by a holder that died (renewal stopped, never settled)
    lease_s = 1.0
    store = redis_stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=lease_s))
    quotas = Quotas(max_concurrency=2)
    live = await store.acquire(WORKER, quotas, 10)
    dead = await store.acquire(WORKER, quotas, 10)
    assert isinstance(dead, _RedisLease)
    assert dead._renewer is not None
    dead._renewer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await dead._renewer

    # When a third call asks for a slot
    started = time.monotonic()
    lease = await asyncio.wait_for(store.acquire(WORKER, quotas, 10), timeout=5)
    elapsed = time.monotonic() - started

    # Then it gets the dead holder's slot about lease_s later, not when the whole key expires
    assert 0.9 * lease_s <= elapsed <= 3 * lease_s, elapsed
    await settle_all([live, lease])


async def test_a_waiter_that_stops_looking_loses_its_place_after_the_grace(
    redis_stores: Stores,
) -> None:
    # Given a held slot, and first in line a call whose process died while it waited: it
    # joined the line once and never looked again
    grace_s = 0.5
    config = QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=5.0, wait_grace_s=grace_s)
    store = redis_stores.make(config)
    assert isinstance(store, RedisQuotas)
    quotas = Quotas(max_concurrency=1)
    held = await store.acquire(WORKER, quotas, 10, tenant="A")
    dead_args = ["0-dead-waiter", 0, 0, 1, 10, 1050, 5000, int(MAX_POLL_S * 1000), "A", 500, 2000]
    taken, _ = await store._acquire(keys=store.keys(WORKER), args=dead_args)
    assert int(taken) == 0

    # When the slot frees and a live call asks for it
    await held.settle(8)
    started = time.monotonic()
    lease = await asyncio.wait_for(store.acquire(WORKER, quotas, 10, tenant="B"), timeout=5)
    elapsed = time.monotonic() - started

    # Then the live call waited for the dead one's next look (due within 0.3 s) plus the grace,
    # and the dead one is out of line
    assert MAX_POLL_S + grace_s * 0.9 <= elapsed <= MAX_POLL_S * 1.2 + grace_s + 0.5, elapsed
    assert await store.client.zcard(store.keys(WORKER)[4]) == 0
    await lease.settle(8)


async def test_only_leases_with_a_concurrency_limit_renew(redis_stores: Stores) -> None:
    store = redis_stores.make(QuotaConfig(window_s=0.5, skew_s=0.05, lease_s=1.0))

    unlimited_slots = await store.acquire(WORKER, Quotas(rpm=10, tpm=1000), 10)
    limited_slots = await store.acquire(WORKER, Quotas(max_concurrency=3), 10)

    assert isinstance(unlimited_slots, _RedisLease)
    assert isinstance(limited_slots, _RedisLease)
    assert unlimited_slots._renewer is None
    renewer = limited_slots._renewer
    assert renewer is not None
    assert not renewer.done()
    await settle_all([unlimited_slots, limited_slots])
    assert renewer.cancelled()  # settling stops the renewal


async def test_a_held_lease_is_renewed_past_its_lease_time(redis_stores: Stores) -> None:
    # Given the only slot held (and renewed) well past lease_s
    lease_s = 0.6
    store = redis_stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=lease_s))
    quotas = Quotas(max_concurrency=1)
    held = await store.acquire(WORKER, quotas, 10)
    got_in: list[float] = []
    waiting = asyncio.create_task(acquire_timed(store, WORKER, quotas, 10, got_in))

    # When the holder keeps it for 1.5 s (2.5 lease times) and then settles
    await asyncio.sleep(1.5)
    assert not waiting.done(), "the slot was taken while its holder still renewed it"
    settled_at = time.monotonic()
    await held.settle(None)

    # Then the waiting call gets in only after the settle
    lease = await asyncio.wait_for(waiting, timeout=3)
    assert got_in[0] >= settled_at
    assert lease.waited_s >= 1.4
    await lease.settle(None)


async def test_settle_returns_even_when_it_lands_during_a_renewal(
    redis_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given held leases whose renewal call to Redis is in flight (a spy around the real RENEW
    # script says when one starts; the script itself still runs on the real Redis)
    store = redis_stores.make(QuotaConfig(window_s=1.0, skew_s=0.05, lease_s=0.3))
    assert isinstance(store, RedisQuotas)
    renewing = asyncio.Event()
    real_renew = store._renew

    async def renew_spy(**kwargs: Any) -> Any:
        renewing.set()
        return await real_renew(**kwargs)

    monkeypatch.setattr(store, "_renew", renew_spy)
    hung: list[int] = []
    for hops in range(4):  # settle 0-3 event-loop steps into the renewal call
        renewing.clear()
        lease = await store.acquire(f"worker-{hops}", Quotas(max_concurrency=1), 10)
        async with asyncio.timeout(2):  # no extra task: resumes right when the renewal starts
            await renewing.wait()
        for _ in range(hops):
            await asyncio.sleep(0)

        # When the call settles at that moment
        settling = asyncio.create_task(lease.settle(None))
        done, _ = await asyncio.wait({settling}, timeout=0.5)
        if not done:
            hung.append(hops)
        await stop_renewers()  # cleanup, so a hung settle can finish
        await settling

    # Then settle always returns promptly (a hung settle also keeps renewing: the slot is lost)
    assert hung == [], f"settle() hung when it landed {hung} loop steps into a renewal"


async def test_quota_keys_expire_so_idle_workers_leave_nothing(redis_stores: Stores) -> None:
    # Given a call that touched every limit
    config = QuotaConfig(window_s=0.3, skew_s=0.05, lease_s=0.3, wait_grace_s=0.1)
    store = redis_stores.make(config)
    assert isinstance(store, RedisQuotas)
    lease = await store.acquire(WORKER, Quotas(rpm=5, tpm=1000, max_concurrency=2), 20)

    # Then each of its keys has a TTL, no longer than its window (or lease) plus 1 s; the line
    # is empty, and its state's TTL is two windows plus the grace plus 1 s
    req, tok, tokn, conc, wait, wexp, wcall, fair = store.keys(WORKER)
    assert [await store.client.exists(key) for key in (wait, wexp, wcall)] == [0, 0, 0]
    assert 0 < await store.client.pttl(fair) <= 2 * config.hold_s * 1000 + 100 + 1000
    hold_ms = config.hold_s * 1000 + 1000
    for key, longest_ms in ((req, hold_ms), (tok, hold_ms), (tokn, hold_ms)):
        assert 0 < await store.client.pttl(key) <= longest_ms, key
    assert 0 < await store.client.pttl(conc) <= config.lease_s * 1000 + 1000

    # When the call settles with its real count and the worker stays idle
    await lease.settle(12)
    assert 0 < await store.client.pttl(tokn) <= hold_ms  # the settle keeps the TTL
    for _ in range(40):  # up to 4 s; the longest TTL is 1.8 s
        if not await redis_stores.keys():
            break
        await asyncio.sleep(0.1)

    # Then every key has vanished
    assert await redis_stores.keys() == []


# -- memory only ----------------------------------------------------------------------------


def test_estimate_tokens_counts_chars_over_four_per_message_plus_the_output_budget() -> None:
    messages = [
        ChatMessage(role="system", content="abcdefgh"),  # 8 chars: 2 tokens + 4
        ChatMessage(role="user", content="abcde"),  # 5 chars: rounds up to 2 tokens + 4
        ChatMessage(role="assistant", content=""),  # empty: just the 4 per message
    ]

    assert estimate_tokens(messages, 100) == 6 + 6 + 4 + 100
    assert estimate_tokens([], 64) == 64
    assert estimate_tokens([ChatMessage(role="user", content="x" * 400)], 0) == 104


async def test_the_free_lease_waits_for_nothing_and_settles_to_nothing() -> None:
    assert FREE_LEASE.waited_s == 0
    await FREE_LEASE.settle(10)  # nothing recorded, nothing to fail
    await FREE_LEASE.settle(None)
    assert FREE_LEASE.waited_s == 0
