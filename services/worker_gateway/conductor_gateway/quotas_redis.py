"""Quotas shared by every gateway replica through Redis.

Each check-and-take is one Lua script, so N replicas cannot all see "one slot left" and all take
it (the failure LiteLLM's issues document: the limit silently becomes limit x replicas). The
script reads Redis's own clock (TIME), so replicas with drifting clocks still share one window.

Keys, per worker (the ``{worker}`` hash tag keeps them in one Redis Cluster slot):
  {prefix}quota:{worker}:req   sorted set, lease id -> time it was counted (RPM window)
  {prefix}quota:{worker}:tok   sorted set, lease id -> time it was counted (TPM window)
  {prefix}quota:{worker}:tokn  hash, lease id -> tokens (the estimate, then the real count)
  {prefix}quota:{worker}:conc  sorted set, lease id -> lease expiry (calls in flight)
  {prefix}quota:{worker}:wait  sorted set, lease id -> tag (the calls waiting, in fair order)
  {prefix}quota:{worker}:wexp  sorted set, lease id -> when a waiter that stopped looking is
                               presumed dead and leaves the line
  {prefix}quota:{worker}:wcall hash, lease id -> "tokens:tenant" of each waiting call
  {prefix}quota:{worker}:fair  hash: "vt" the tag of the last call let through; per tenant
                               with calls waiting, "t:TENANT" its last tag, "n:TENANT" how many
A holder renews its concurrency lease while its call runs; a holder that dies stops renewing
and its slot is freed when the lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from conductor.pool import Quotas
from conductor_gateway.quotas import (
    FREE_LEASE,
    HEAD_POLL_S,
    MAX_POLL_S,
    QuotaConfig,
    QuotaLease,
    limited,
    new_lease_id,
    reserve,
    wait_a_little,
)

logger = logging.getLogger(__name__)

# Removes a waiter from the line (KEYS[5..8]); a tenant left with none forgets its last tag, so
# its next call starts level with the others.
LEAVE_LINE = """
local function leave(w)
  local call = redis.call('HGET', KEYS[7], w)
  redis.call('ZREM', KEYS[5], w)
  redis.call('ZREM', KEYS[6], w)
  redis.call('HDEL', KEYS[7], w)
  if call then
    local tenant = string.match(call, '^%d+:(.*)$')
    if redis.call('HINCRBY', KEYS[8], 'n:' .. tenant, -1) <= 0 then
      redis.call('HDEL', KEYS[8], 'n:' .. tenant, 't:' .. tenant)
    end
  end
end
"""

# ARGV: lease id, rpm, tpm, max concurrency (0 = no limit), tokens, hold ms, lease ms, poll ms,
# tenant, grace ms, head poll ms. Returns {1, 0} when taken, {0, wait_ms} when the call must wait.
ACQUIRE = (
    LEAVE_LINE
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens, hold, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local poll, tenant, grace = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local head_poll = tonumber(ARGV[11])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - hold)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - hold)
for i = 1, #old do
  redis.call('ZREM', KEYS[2], old[i])
  redis.call('HDEL', KEYS[3], old[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now)) do leave(w) end
-- Join the line (once): one past the later of the tenant's last tag and the last let through.
local tag = redis.call('ZSCORE', KEYS[5], id)
if not tag then
  local vt = tonumber(redis.call('HGET', KEYS[8], 'vt') or '0')
  local last = tonumber(redis.call('HGET', KEYS[8], 't:' .. tenant) or '0')
  tag = math.max(vt, last) + 1
  redis.call('ZADD', KEYS[5], tag, id)
  redis.call('HSET', KEYS[7], id, tokens .. ':' .. tenant)
  redis.call('HSET', KEYS[8], 't:' .. tenant, tag)
  redis.call('HINCRBY', KEYS[8], 'n:' .. tenant, 1)
end
tag = tonumber(tag)
local wait = 0
if rpm > 0 and redis.call('ZCARD', KEYS[1]) >= rpm then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  wait = math.max(wait, tonumber(first[2]) + hold - now)
end
local used = 0
if tpm > 0 then
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
  wait = math.max(wait, poll)
end
-- Room for this call: the calls ahead in line must fit beside it, or they go first.
local rank = redis.call('ZRANK', KEYS[5], id)
if wait == 0 and rank > 0 then
  if rpm > 0 and redis.call('ZCARD', KEYS[1]) + rank >= rpm then wait = poll end
  if conc > 0 and redis.call('ZCARD', KEYS[4]) + rank >= conc then wait = poll end
  if wait == 0 and tpm > 0 then
    local need = used + tokens
    for _, w in ipairs(redis.call('ZRANGE', KEYS[5], 0, rank - 1)) do
      local call = redis.call('HGET', KEYS[7], w)
      need = need + tonumber(string.match(call or '0:', '^(%d+):'))
      if need > tpm then
        wait = poll
        break
      end
    end
  end
end
local ttl = 2 * hold + grace + 1000
if wait > head_poll and rank == 0 and redis.call('ZCARD', KEYS[5]) > 1 then
  wait = head_poll  -- first in line, others behind: it looks again soon, nobody may pass it
end
if wait > 0 then
  wait = math.max(1, math.ceil(wait))
  -- Looks again in wait * 1.2 at most (jitter); presumed dead if it has not by then plus grace.
  redis.call('ZADD', KEYS[6], now + math.ceil(wait * 1.2) + grace, id)
  for i = 5, 8 do redis.call('PEXPIRE', KEYS[i], ttl) end
  return {0, wait}
end
leave(id)
if tag > tonumber(redis.call('HGET', KEYS[8], 'vt') or '0') then
  redis.call('HSET', KEYS[8], 'vt', tag)
end
redis.call('PEXPIRE', KEYS[8], ttl)
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
)

# A call that stops waiting (cancelled) leaves the line. ARGV: lease id.
LEAVE = LEAVE_LINE + "leave(ARGV[1])\nreturn 1\n"

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
        self._leave = client.register_script(LEAVE)

    def keys(self, worker: str) -> list[str]:
        base = f"{self.prefix}quota:{{{worker}}}"
        return [
            f"{base}:{name}"
            for name in ("req", "tok", "tokn", "conc", "wait", "wexp", "wcall", "fair")
        ]

    async def acquire(
        self, worker: str, quotas: Quotas, tokens: int, tenant: str | None = None
    ) -> QuotaLease:
        if not limited(quotas):  # nothing to count: no round trip to Redis
            return FREE_LEASE
        lease_id = new_lease_id()
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
            tenant or "",
            int(self.config.wait_grace_s * 1000),
            int(HEAD_POLL_S * 1000),
        ]
        started = time.monotonic()
        try:
            while True:
                taken, wait_ms = await self._acquire(keys=keys, args=args)
                if int(taken) == 1:
                    break
                await wait_a_little(int(wait_ms) / 1000)
        except BaseException:
            await asyncio.shield(self._leave_line(keys, lease_id))
            raise
        lease = _RedisLease(self, keys, lease_id, time.monotonic() - started)
        if quotas.max_concurrency:
            lease.start_renewing(self.config.lease_s)
        return lease

    async def _leave_line(self, keys: list[str], lease_id: str) -> None:
        try:
            await self._leave(keys=keys, args=[lease_id])
        except (aioredis.RedisError, OSError) as exc:  # it leaves when presumed dead instead
            logger.warning("could not take quota waiter %s out of line: %s", lease_id, exc)


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
                keys=self.keys[:4], args=[self.lease_id, -1 if tokens is None else tokens]
            )
        except (aioredis.RedisError, OSError) as exc:
            # Raising would throw away an answer already paid for, and the call would be made
            # again. Unsettled, the slot frees when the lease lapses and the estimate stands.
            logger.warning("could not settle quota lease %s: %s", self.lease_id, exc)
