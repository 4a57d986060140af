"""kombu's Redis transport with one redis-py client per channel for its acks and publishes,
and a pool that makes threads wait for a connection rather than fail.

kombu builds a new redis-py client object whenever it needs one without holding one: for every
acknowledgement, every delivery's bookkeeping and every publish. Building a redis-py client
registers its ~200 response callbacks, about 60 µs each time, and that was 9% of the
aggregator's CPU under load (a profile of the distributed one-step benchmark). A redis-py
client is safe to share between threads (each command borrows a connection from the pool), so
each channel keeps one.

Acks come from Celery's task threads (a gateway runs 100), while kombu's pool holds 10
connections and raises "Too many connections" past them: the ack is lost and the message is
delivered again after the visibility timeout, a provider call paid twice. Here a thread past
the tenth waits for a connection (an ack holds one for well under a millisecond).

Celery selects this transport by its import path (``broker_transport``); everything else is
kombu's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

TRANSPORT_PATH = "conductor_adapters.redis_broker:Transport"
POOL_WAIT_S = 30.0


# The ignores below: kombu's stubs leave out the pool and client factories overridden here.
class Channel(kombu_redis.Channel):
    def _get_pool(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the event loop's own connections (BRPOP): kombu's as they are
            return super()._get_pool(asynchronous=True)  # type: ignore[misc]
        params = self._connparams(asynchronous=False)  # type: ignore[attr-defined]
        self.keyprefix_fanout = self.keyprefix_fanout.format(db=params["db"])
        return redis.BlockingConnectionPool(timeout=POOL_WAIT_S, **params)  # type: ignore[no-untyped-call]

    @cached_property
    def _shared_client(self) -> Any:
        return self._create_client()  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client if client else self._shared_client


class Transport(kombu_redis.Transport):
    Channel = Channel
