"""Quotas shared by every gateway replica through Redis.

Each check-and-take is one Lua script, so N replicas cannot all see "one slot left" and all take
it (the failure LiteLLM's issues document: the limit silently becomes limit x replicas). The
script reads Redis's own clock (TIME), so replicas with drifting clocks still share one window.

Keys, per worker (the ``{worker}`` hash tag keeps them in one Redis Cluster slot):
  {prefix}quota:{worker}:req   sorted set, lease id -> time it was counted (RPM window)
  {prefix}quota:{worker}:tok   sorted set, lease id -> time it was counted (TPM window)
  {prefix}quota:{worker}:tokn  hash, lease id -> tokens (the estimate, then the real count)
  {prefix}quota:{worker}:conc  sorted set, lease id -> lease expiry (calls in flight)
A holder renews its concurrency lease while its call runs; a holder that dies stops renewing
and its slot is freed when the lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from conductor.pool import Quotas
from conductor_gateway.quotas import (
    FREE_LEASE,
    MAX_POLL_S,
    QuotaConfig,
    QuotaLease,
    limited,
    reserve,
    wait_a_little,
)

logger = logging.getLogger(__name__)

# ARGV: lease id, rpm, tpm, max concurrency (0 = no limit), tokens, hold ms, lease ms.
# Returns {1, 0} when taken, {0, wait_ms} when the call must wait.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens, hold, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - hold)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - hold)
for i = 1, #old do
  redis.call('ZREM', KEYS[2], old[i])
  redis.call('HDEL', KEYS[3], old[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local wait = 0
if rpm > 0 and redis.call('ZCARD', KEYS[1]) >= rpm then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  wait = math.max(wait, tonumber(first[2]) + hold - now)
end
if tpm > 0 then
  local used = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[3])) do used = used + tonumber(v) end
  local excess = used + tokens - tpm
  if excess > 0 then
    local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local until_free = hold
    for i = 1, #entries, 2 do
      excess = excess - tonumber(redis.call('HGET', KEYS[3], entries[i]) or '0')
      if excess <= 0 then
        until_free = tonumber(entries[i + 1]) + hold - now
        break
      end
    end
    wait = math.max(wait, until_free)
  end
end
if conc > 0 and redis.call('ZCARD', KEYS[4]) >= conc then
  wait = math.max(wait, tonumber(ARGV[8]))
end
if wait > 0 then
  return {0, math.max(1, math.ceil(wait))}
end
if rpm > 0 then
  redis.call('ZADD', KEYS[1], now, id)
  redis.call('PEXPIRE', KEYS[1], hold + 1000)
end
if tpm > 0 then
  redis.call('ZADD', KEYS[2], now, id)
  redis.call('HSET', KEYS[3], id, tokens)
  redis.call('PEXPIRE', KEYS[2], hold + 1000)
  redis.call('PEXPIRE', KEYS[3], hold + 1000)
end
if conc > 0 then
  redis.call('ZADD', KEYS[4], now + lease, id)
  redis.call('PEXPIRE', KEYS[4], lease + 1000)
end
return {1, 0}
"""

# ARGV: lease id, real tokens (-1 = keep the estimate). Frees the slot, settles the tokens.
SETTLE = """
if tonumber(ARGV[2]) >= 0 and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
end
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
"""

# ARGV: lease id, lease ms. Extends a held slot; a slot already expired stays freed.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local renewed = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 1000)
return renewed
"""


class RedisQuotas:
    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = "conductor:",
        config: QuotaConfig | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.config = config or QuotaConfig()
        self._acquire = client.register_script(ACQUIRE)
        self._settle = client.register_script(SETTLE)
        self._renew = client.register_script(RENEW)

    def keys(self, worker: str) -> list[str]:
        base = f"{self.prefix}quota:{{{worker}}}"
        return [f"{base}:req", f"{base}:tok", f"{base}:tokn", f"{base}:conc"]

    async def acquire(self, worker: str, quotas: Quotas, tokens: int) -> QuotaLease:
        if not limited(quotas):  # nothing to count: no round trip to Redis
            return FREE_LEASE
        lease_id = uuid.uuid4().hex
        keys = self.keys(worker)
        args: list[str | int] = [
            lease_id,
            quotas.rpm or 0,
            quotas.tpm or 0,
            quotas.max_concurrency or 0,
            reserve(quotas, tokens),
            int(self.config.hold_s * 1000),
            int(self.config.lease_s * 1000),
            int(MAX_POLL_S * 1000),
        ]
        started = time.monotonic()
        while True:
            taken, wait_ms = await self._acquire(keys=keys, args=args)
            if int(taken) == 1:
                break
            await wait_a_little(int(wait_ms) / 1000)
        lease = _RedisLease(self, keys, lease_id, time.monotonic() - started)
        if quotas.max_concurrency:
            lease.start_renewing(self.config.lease_s)
        return lease


@dataclass
class _RedisLease:
    store: RedisQuotas
    keys: list[str]
    lease_id: str
    waited_s: float
    _renewer: asyncio.Task[None] | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def start_renewing(self, lease_s: float) -> None:
        self._renewer = asyncio.create_task(self._renew_forever(lease_s))

    async def _renew_forever(self, lease_s: float) -> None:
        while not self._stopped:
            await asyncio.sleep(lease_s / 3)
            try:
                await self.store._renew(
                    keys=[self.keys[3]], args=[self.lease_id, int(lease_s * 1000)]
                )
            except aioredis.RedisError as exc:  # the lease may lapse; the call itself goes on
                logger.warning("could not renew quota lease %s: %s", self.lease_id, exc)

    async def settle(self, tokens: int | None) -> None:
        renewer = self._renewer
        if renewer is not None:
            self._stopped = True
            # Cancel until it takes: redis-py's wait_for can swallow a cancel that lands as a
            # renewal completes (Python 3.11), and a lost cancel would renew the slot forever.
            while not renewer.done():
                renewer.cancel()
                await asyncio.wait({renewer}, timeout=0.05)
        try:
            await self.store._settle(
                keys=self.keys, args=[self.lease_id, -1 if tokens is None else tokens]
            )
        except (aioredis.RedisError, OSError) as exc:
            # Raising would throw away an answer already paid for, and the call would be made
            # again. Unsettled, the slot frees when the lease lapses and the estimate stands.
            logger.warning("could not settle quota lease %s: %s", self.lease_id, exc)
