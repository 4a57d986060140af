"""One asyncio event loop on a background thread, shared by every Celery task thread.

Why: Celery runs tasks on threads, while the clients they use (httpx, redis.asyncio, grpc.aio)
are asyncio. A gateway process must hold hundreds of slow LLM calls in flight. Celery's thread pool
gives each in-flight task a thread (a few KB of Python state while it waits); the HTTP calls,
quota waits and backoff sleeps of all of them run as coroutines on this one loop, sharing one
connection pool per provider. Blocking threads on futures is cheap; 500 event loops or 500
synchronous HTTP clients would not be.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "conductor-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and block the calling thread until it is done."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
