"""The caller's side of the gateway queues: a StepRunner that sends each call as a Celery task.

Replies come back on one Redis list per runner, read by one background task that resolves the
waiting calls by id, so hundreds of calls in flight cost one Redis connection, not hundreds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis
from celery import Celery

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Sampling, ToolUse
from conductor.errors import StepCallFailed
from conductor.messaging import (
    CALL_WORKER_TASK,
    CallReply,
    CallRequest,
    answer_stream_key,
    queue_for,
)
from conductor.pool import Pool
from conductor.ports import DeltaSink, StepCallResult
from conductor.tracing import current_traceparent
from conductor.workflow import AttemptRecord
from conductor_adapters.answer_streams import START, read_pieces
from conductor_adapters.queue import send

logger = logging.getLogger(__name__)


class QueuedStepRunner:
    """Implements the StepRunner port over the ``gateway.<vendor>`` queues."""

    def __init__(
        self,
        app: Celery,
        pool: Pool,
        redis: aioredis.Redis,
        *,
        prefix: str = "conductor:",
        worker_names: frozenset[str] | None = None,
        reply_timeout_s: float = 600.0,
    ) -> None:
        self.app = app
        self.pool = pool
        self.redis = redis
        self.reply_timeout_s = reply_timeout_s
        self.prefix = prefix
        self.reply_to = f"{prefix}replies:{uuid.uuid4().hex}"
        self._names = worker_names or frozenset(w.name for w in pool.available())
        self._waiting: dict[str, asyncio.Future[CallReply]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def worker_names(self) -> frozenset[str]:
        return self._names

    async def call(
        self,
        worker: str,
        messages: Sequence[ChatMessage],
        *,
        allowed_workers: Collection[str] | None = None,
        tenant: str | None = None,
        tools: ToolUse | None = None,
        sampling: Sampling | None = None,
        attempts: list[AttemptRecord] | None = None,
        answer_format: AnswerFormat | None = None,
        deltas: DeltaSink | None = None,
    ) -> StepCallResult:
        # ``attempts`` stays empty: the calls are made, and known, in a gateway process (a
        # pass-through call has no trace to record them in). ``deltas`` gets the answer's
        # text from the Redis stream the gateway appends it to.
        spec = self.pool.get(worker)
        call_id = uuid.uuid4().hex
        stream = answer_stream_key(self.prefix, f"call-{call_id}") if deltas else None
        request = CallRequest(
            call_id=call_id,
            answer_stream=stream,
            worker=worker,
            messages=list(messages),
            reply_to=self.reply_to,
            allowed_workers=None if allowed_workers is None else sorted(allowed_workers),
            tenant=tenant,
            tools=tools,
            sampling=sampling,
            answer_format=answer_format,
            # The gateway gives up when this caller does: no call outlives its waiter.
            expires_at=datetime.now(UTC) + timedelta(seconds=self.reply_timeout_s),
            trace_parent=current_traceparent(),  # the gateway's spans go under this request's
        )
        reply_future: asyncio.Future[CallReply] = asyncio.get_running_loop().create_future()
        self._waiting[request.call_id] = reply_future
        self._ensure_reader()
        relay = _Relay(self.redis, stream, deltas) if stream and deltas else None
        try:
            await asyncio.to_thread(
                send, self.app, CALL_WORKER_TASK, [request.model_dump(mode="json")], queue_for(spec)
            )
            if relay is None:
                reply = await asyncio.wait_for(reply_future, self.reply_timeout_s)
            else:
                reply = await relay.until(reply_future, self.reply_timeout_s)
        except TimeoutError:
            raise StepCallFailed(
                f"{worker}: no reply from the gateway within {self.reply_timeout_s:g} s "
                f"(is a gateway consuming {queue_for(spec)}?)",
                [],
            ) from None
        finally:
            self._waiting.pop(request.call_id, None)
        if reply.ok and reply.result is not None:
            return reply.result
        raise StepCallFailed(reply.error or "the gateway reported a failure", reply.attempts)

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._closing = False
            self._reader = asyncio.create_task(self._read_replies())

    async def _read_replies(self) -> None:
        # Stopped between reads (each waits 1 s at most), never cancelled mid-command: a
        # cancelled BLPOP could leave its connection with a reply the next command would read,
        # and was seen to hang the cancel for seconds.
        while not self._closing:
            try:
                item = await self.redis.blpop([self.reply_to], timeout=1)
            except aioredis.RedisError as exc:  # Redis restarting: keep waiting, replies keep
                logger.warning("reading gateway replies: %s; retrying", exc)
                await asyncio.sleep(0.5)
                continue
            if item is None:
                continue
            reply = CallReply.model_validate_json(item[1])
            future = self._waiting.get(reply.call_id)
            if future is not None and not future.done():
                future.set_result(reply)
            # Else a duplicate (a redelivered call answered twice) or a call that gave up.

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Stop reading replies: the reader stops after its current read (1 s at most).
        Bounded: a reader stuck on a Redis connection that does not answer is cancelled and
        left behind with a warning rather than holding up the caller's shutdown."""
        reader, self._reader = self._reader, None
        if reader is None or reader.done():
            return
        self._closing = True
        done, _ = await asyncio.wait({reader}, timeout=timeout_s)
        if not done:
            reader.cancel()
            logger.warning("the gateway reply reader did not stop within %g s", timeout_s)
            return
        with contextlib.suppress(asyncio.CancelledError):
            reader.result()


class _Relay:
    """Hands a call's streamed text, read from its Redis stream, to the caller's sink while
    the call runs; then the rest, read once the reply has come (the gateway appended every
    piece before it replied). A read is never cancelled while it waits on Redis (a command
    cut mid-way could leave its connection with a reply that the next command would read):
    the relay looks for its stop between short reads."""

    BLOCK_MS = 100

    def __init__(self, redis: aioredis.Redis, key: str, sink: DeltaSink) -> None:
        self.redis, self.key, self.sink, self.last_id = redis, key, sink, START
        self.stopping = False

    async def until(self, reply: asyncio.Future[CallReply], timeout_s: float) -> CallReply:
        relaying = asyncio.create_task(self._relay())
        try:
            return await asyncio.wait_for(asyncio.shield(reply), timeout_s)
        finally:
            self.stopping = True
            await asyncio.shield(relaying)
            if reply.done():
                with contextlib.suppress(aioredis.RedisError, OSError):
                    await self._read(block_ms=None)
            with contextlib.suppress(aioredis.RedisError, OSError):
                await self.redis.delete(self.key)

    async def _relay(self) -> None:
        while not self.stopping:
            try:
                await self._read(block_ms=self.BLOCK_MS)
            except (aioredis.RedisError, OSError) as exc:  # the answer still comes whole
                logger.warning("reading the streamed text of %s: %s", self.key, exc)
                await asyncio.sleep(0.5)

    async def _read(self, block_ms: int | None) -> None:
        self.last_id, pieces = await read_pieces(self.redis, self.key, self.last_id, block_ms)
        for text in pieces:
            await self.sink(text)
