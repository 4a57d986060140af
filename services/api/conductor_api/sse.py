"""Server-sent events: framing, and keep-alives while a stream waits."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

T = TypeVar("T")
KEEPALIVE_S = 15.0  # proxies close idle connections; a comment line keeps them open
KEEPALIVE = ": keep-alive\n\n"
# No caching, and no buffering by proxies (nginx honours X-Accel-Buffering): events flow as sent.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_END = object()


def data_line(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, default=str)}\n\n"


def event_frame(event_id: int, kind: str, payload: Any) -> str:
    body = json.dumps(payload, ensure_ascii=False, default=str)
    return f"id: {event_id}\nevent: {kind}\ndata: {body}\n\n"


def named_frame(kind: str, payload: Any) -> str:
    """An event without an id: one that is not stored, so a client's resume point stays put."""
    body = json.dumps(payload, ensure_ascii=False, default=str)
    return f"event: {kind}\ndata: {body}\n\n"


async def with_keepalive(
    source: AsyncIterator[T], interval_s: float = KEEPALIVE_S
) -> AsyncGenerator[T | None, None]:
    """Items of ``source``, and None whenever ``interval_s`` passes without one.

    A task pumps the source into a queue, so waiting with a timeout never cancels the source
    mid-item; the task is cancelled when the consumer stops early (client gone).
    """
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)

    async def pump() -> None:
        try:
            async for item in source:
                await queue.put(item)
        except Exception as exc:
            await queue.put(exc)
            return
        await queue.put(_END)

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), interval_s)
            except TimeoutError:
                yield None
                continue
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
