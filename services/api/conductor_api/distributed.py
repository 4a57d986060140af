"""The distributed runtime behind the API: submit through the broker, follow through Redis.

Submitting writes the queued workflow to Postgres with its start message, staged in the
outbox in the same transaction, and answers at once: this process's relay sends the message
in the background (conductor_adapters.outbox_relay), so a client never waits for the broker,
and a broker that is down delays the start without losing it (the aggregators' sweepers send
what the relay did not). Cancels go the same way. Aggregators announce each batch of stored
events on a Redis channel per workflow; this process listens on all of them with one pattern
subscription and wakes the readers of that workflow. Pass-through calls go to the vendor
queues like any step, with replies on this process's own Redis list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

import grpc
import redis.asyncio as aioredis
from celery import Celery
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from sqlalchemy import Engine, text

from conductor.machine import FINAL_EVENT_KINDS
from conductor.pool import Pool
from conductor.ports import StepRunner
from conductor_adapters.outbox_relay import OutboxRelay
from conductor_adapters.store.runs import SubmitRequest, stage_cancel, stage_submission
from conductor_api.runtime import (
    ANNOUNCED_POLL_S,
    POLL_INTERVAL_S,
    AnswerSource,
    EventSignals,
    RedisAnswerPieces,
)

logger = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 2.0


class DistributedRuntime:
    """A ``WorkflowRuntime``: aggregators run the workflows; this process stages their start
    and cancel messages, hears their events announced, and sends calls of one worker to the
    vendor queues."""

    mode = "distributed"
    # Plans are made by the aggregators; a submitted job waits in the queue for a planner.
    advisory_checks = frozenset({"planner"})

    def __init__(
        self,
        *,
        engine: Engine,
        app: Celery,
        redis: aioredis.Redis,
        redis_prefix: str,
        runner: StepRunner,
        pool: Pool,
        planner_addr: str,
    ) -> None:
        self.engine = engine
        self.pool = pool
        self.signals = EventSignals()
        # A streamed answer's text, appended to Redis by the gateway that runs its step.
        self.answer_pieces: AnswerSource | None = RedisAnswerPieces(redis, redis_prefix, engine)
        self.app = app
        self.redis = redis
        self.redis_prefix = redis_prefix
        self.planner_addr = planner_addr
        self.runner = runner  # pass-through calls: the vendor queues, replies on Redis
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = False  # to the aggregators' event announcements
        self._planner_channel: grpc.aio.Channel | None = None
        self.relay = OutboxRelay(engine, app)  # sends the start and cancel messages

    @property
    def worker_names(self) -> list[str]:
        # The aggregator offers every worker of the pool file; a gateway without a worker's
        # key fails its steps with the reason.
        return [w.name for w in self.pool.workers]

    async def start(self) -> None:
        self._planner_channel = grpc.aio.insecure_channel(self.planner_addr)
        self._listener = asyncio.create_task(self._listen(), name="event-announcements")

    async def submit(self, request: SubmitRequest) -> uuid.UUID:
        # Committed with its start message; the answer does not wait for the broker.
        workflow_id, staged = await asyncio.to_thread(stage_submission, self.engine, request)
        self.relay.put([staged])
        return workflow_id

    async def request_cancel(self, workflow_id: uuid.UUID, reason: str) -> None:
        # The aggregators end it, under the run's lock, started or still queued.
        staged = await asyncio.to_thread(stage_cancel, self.engine, workflow_id, reason)
        self.relay.put([staged])

    async def wait_for_run(self, workflow_id: uuid.UUID) -> bool:
        return False  # every workflow runs on an aggregator: its events say when it ended

    def poll_interval_s(self, workflow_id: uuid.UUID) -> float:
        return ANNOUNCED_POLL_S if self._subscribed else POLL_INTERVAL_S

    async def _listen(self) -> None:
        pattern = f"{self.redis_prefix}events:*"
        prefix_len = len(pattern) - 1
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.psubscribe(pattern)
                # Subscribed (again): announcements from now on arrive; readers re-read once
                # for any sent while this was not listening.
                self._subscribed = True
                self.signals.wake_all()
                async for message in pubsub.listen():
                    if message.get("type") != "pmessage":
                        continue
                    self._announce(message["channel"][prefix_len:], message["data"])
            except (aioredis.RedisError, OSError) as exc:
                # Readers poll the table meanwhile; only the wake-ups pause.
                self._subscribed = False
                self.signals.wake_all()
                logger.warning("event announcements interrupted (%s); resubscribing", exc)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _announce(self, channel: bytes | str, data: bytes | str) -> None:
        try:
            workflow_id = uuid.UUID(channel.decode() if isinstance(channel, bytes) else channel)
            notice: dict[str, Any] = json.loads(data)
            final = notice.get("kind") in FINAL_EVENT_KINDS
            self.signals.announce(workflow_id, int(notice["sequence"]), final=final)
        except (ValueError, KeyError, TypeError):
            logger.warning("ignoring a malformed event announcement on %r", channel)

    async def readiness(self) -> dict[str, str]:
        checks = await asyncio.gather(
            self._check(self._database),
            self._check(self._broker),
            self._check(self._redis),
            self._check(self._planner),
        )
        return dict(zip(("database", "broker", "redis", "planner"), checks, strict=True))

    @staticmethod
    async def _check(probe: Any) -> str:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                result: str = await probe()
                return result
        except TimeoutError:
            return f"no answer within {CHECK_TIMEOUT_S:g} s"
        except Exception as exc:
            return f"unreachable: {type(exc).__name__}"

    async def _database(self) -> str:
        def ping() -> None:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))

        await asyncio.to_thread(ping)
        return "ok"

    async def _broker(self) -> str:
        def ping() -> None:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=int(CHECK_TIMEOUT_S))

        await asyncio.to_thread(ping)
        return "ok"

    async def _redis(self) -> str:
        await self.redis.ping()
        return "ok"

    async def _planner(self) -> str:
        assert self._planner_channel is not None, "start() first"
        stub = health_pb2_grpc.HealthStub(self._planner_channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""))
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            return "not serving (loading or draining)"
        return "ok"

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await asyncio.to_thread(self.relay.close)
        await self.runner.aclose()
        if self._planner_channel is not None:
            await self._planner_channel.close()
        await self.redis.aclose()
