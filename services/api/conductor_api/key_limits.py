"""Each API key's limits, checked before any work starts: requests per minute, tokens per
minute, workflows at once, and a budget per day or month.

Requests per minute use the ``limits`` library's moving window, in Redis for the distributed
API (every replica shares one window per key) and in memory for the embedded one (one
process). While that Redis cannot be reached, each replica counts a key's requests in its own
memory instead: the limit still holds per process (so, with N replicas, a key may get up to N
times its rate meanwhile), and no request fails for want of Redis. The other three are read
from the trace table, which every replica and runtime writes: a key's workflows queued or
running, the tokens of its workflows that ended in the last minute, and the cost of those it
submitted this period; its calls of single workers (pass-through) add their tokens and cost
from the ``direct_call`` table. They are exact whatever replica took the work; their limits
hold from the next request on (a request running when a budget is spent finishes).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.errors import StorageError
from sqlalchemy import Engine, func, select

from conductor_adapters.store.keys import KeyLimits
from conductor_adapters.store.models import direct_call_table, workflow_table
from conductor_api.errors import ApiError

logger = logging.getLogger(__name__)

ACTIVE = ("queued", "running")
# A Redis that does not answer within this is treated as down (counted in memory meanwhile).
REDIS_TIMEOUT_S = 2.0
RETRY_WHEN_BUSY_S = 5  # a key at its concurrency limit: a workflow may end any moment


@dataclass(frozen=True)
class Usage:
    """What a key has in use or spent, as the trace table says now."""

    active: int
    tokens_last_minute: int
    oldest_tokens_at: datetime | None
    spent_usd: float


def period_start(period: str, now: datetime) -> datetime:
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == "day" else day.replace(day=1)


def period_end(period: str, now: datetime) -> datetime:
    start = period_start(period, now)
    if period == "day":
        return start + timedelta(days=1)
    return (start + timedelta(days=32)).replace(day=1)


def read_usage(
    engine: Engine, key_id: str, limits: KeyLimits, now: datetime, *, count_active: bool
) -> Usage:
    table = workflow_table
    mine = table.c.key_id == key_id
    active, tokens, oldest, spent = 0, 0, None, 0.0
    direct, by_key = direct_call_table, direct_call_table.c.key_id == key_id
    with engine.connect() as conn:
        if count_active and limits.max_concurrent is not None:
            active = conn.execute(
                select(func.count()).where(mine, table.c.status.in_(ACTIVE))
            ).scalar_one()
        if limits.tpm_limit is not None:
            since = now - timedelta(minutes=1)
            # created_at bounds the index range; a workflow's tokens count once it ended.
            window = (mine, table.c.created_at >= since - timedelta(days=1))
            row = conn.execute(
                select(
                    func.coalesce(func.sum(table.c.total_tokens), 0),
                    func.min(table.c.finished_at),
                ).where(*window, table.c.finished_at >= since)
            ).one()
            direct_row = conn.execute(
                select(
                    func.coalesce(func.sum(direct.c.total_tokens), 0), func.min(direct.c.at)
                ).where(by_key, direct.c.at >= since)
            ).one()
            tokens = int(row[0]) + int(direct_row[0])
            oldest = min((t for t in (row[1], direct_row[1]) if t is not None), default=None)
        if limits.budget_usd is not None and limits.budget_period is not None:
            start = period_start(limits.budget_period, now)
            spent = float(
                conn.execute(
                    select(func.coalesce(func.sum(table.c.cost_usd), 0.0)).where(
                        mine, table.c.created_at >= start
                    )
                ).scalar_one()
            ) + float(
                conn.execute(
                    select(func.coalesce(func.sum(direct.c.cost_usd), 0.0)).where(
                        by_key, direct.c.at >= start
                    )
                ).scalar_one()
            )
    return Usage(active, tokens, oldest, spent)


class KeyLimiter:
    """Admits or refuses (429, with Retry-After) a key's next request."""

    def __init__(self, engine: Engine, storage: Storage | None = None) -> None:
        self.engine = engine
        self.requests = MovingWindowRateLimiter(storage or MemoryStorage())
        # Where requests are counted while the shared storage cannot be reached.
        self._local = MovingWindowRateLimiter(MemoryStorage())
        self._shared_down = False

    @classmethod
    def on_redis(cls, engine: Engine, redis_url: str, prefix: str) -> KeyLimiter:
        storage = RedisStorage(
            f"async+{redis_url}",
            implementation="redispy",
            key_prefix=f"{prefix}limits",
            wrap_exceptions=True,  # any failure of Redis is a StorageError
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
        )
        return cls(engine, storage)

    async def _count(self, item: RateLimitItem, key_id: str) -> tuple[bool, float, int]:
        """Count one request of ``key_id``: admitted, when its window resets, how many are
        left; in this process's memory while the shared storage fails."""
        try:
            admitted = await self.requests.hit(item, key_id)
            stats = await self.requests.get_window_stats(item, key_id)
        except StorageError as exc:
            if not self._shared_down:
                logger.warning(
                    "requests per minute are counted in this process while their Redis "
                    "cannot be reached (%s)",
                    exc.storage_error,
                )
                self._shared_down = True
            admitted = await self._local.hit(item, key_id)
            stats = await self._local.get_window_stats(item, key_id)
            return admitted, stats.reset_time, stats.remaining
        if self._shared_down:
            logger.warning("requests per minute are counted in Redis again")
            self._shared_down = False
        return admitted, stats.reset_time, stats.remaining

    async def admit(
        self, key_id: str | None, limits: KeyLimits | None, *, starts_workflow: bool
    ) -> dict[str, str]:
        """The headers that tell the client where it stands; ApiError 429 when a limit is
        reached (nothing is started then)."""
        if key_id is None or limits is None:
            return {}
        headers: dict[str, str] = {}
        if limits.rpm_limit is not None:
            item = RateLimitItemPerMinute(limits.rpm_limit)
            admitted, reset_time, remaining = await self._count(item, key_id)
            reset_s = max(0, math.ceil(reset_time - time.time()))
            headers.update(
                {
                    "x-ratelimit-limit-requests": str(limits.rpm_limit),
                    "x-ratelimit-remaining-requests": str(remaining),
                    "x-ratelimit-reset-requests": f"{reset_s}s",
                }
            )
            if not admitted:
                raise _refused(
                    f"this key's limit of {limits.rpm_limit} requests per minute is reached",
                    "rate_limit_exceeded",
                    max(1, reset_s),
                    headers,
                )
        needs_db = (
            limits.tpm_limit is not None
            or limits.budget_usd is not None
            or (starts_workflow and limits.max_concurrent is not None)
        )
        if not needs_db:
            return headers
        now = datetime.now(UTC)
        usage = await asyncio.to_thread(
            read_usage, self.engine, key_id, limits, now, count_active=starts_workflow
        )
        if limits.tpm_limit is not None:
            remaining = max(0, limits.tpm_limit - usage.tokens_last_minute)
            headers["x-ratelimit-limit-tokens"] = str(limits.tpm_limit)
            headers["x-ratelimit-remaining-tokens"] = str(remaining)
            if remaining == 0:
                oldest = usage.oldest_tokens_at or now
                wait = math.ceil((oldest + timedelta(minutes=1) - now).total_seconds())
                raise _refused(
                    f"this key's limit of {limits.tpm_limit} tokens per minute is reached",
                    "tokens_limit_exceeded",
                    max(1, wait),
                    headers,
                )
        if limits.budget_usd is not None and limits.budget_period is not None:
            left = max(0.0, limits.budget_usd - usage.spent_usd)
            headers["x-conductor-budget-remaining-usd"] = f"{left:.6f}"
            if left <= 0:
                until = period_end(limits.budget_period, now)
                raise _refused(
                    f"this key's budget of {limits.budget_usd:g} USD per "
                    f"{limits.budget_period} is spent; it renews at {until.isoformat()}",
                    "budget_exceeded",
                    math.ceil((until - now).total_seconds()),
                    headers,
                    retry=False,  # not before the period ends
                )
        busy = limits.max_concurrent is not None and usage.active >= limits.max_concurrent
        if starts_workflow and busy:
            raise _refused(
                f"this key has {usage.active} workflows queued or running, its limit",
                "concurrency_limit_exceeded",
                RETRY_WHEN_BUSY_S,
                headers,
            )
        return headers


def _refused(
    reason: str, code: str, retry_after_s: int, headers: dict[str, str], *, retry: bool = True
) -> ApiError:
    return ApiError(
        429,
        f"{reason}; try again in {retry_after_s} s",
        code=code,
        retry=retry,
        headers={**headers, "Retry-After": str(retry_after_s)},
    )
