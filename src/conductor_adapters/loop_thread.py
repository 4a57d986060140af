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
import contextlib
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
        """Cancel what still runs (threads blocked in ``run`` get CancelledError rather than
        waiting forever), then stop the loop."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        if self._thread.is_alive():
            # A task that ignores cancellation for 10 s does not hold the stop up.
            with contextlib.suppress(TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
