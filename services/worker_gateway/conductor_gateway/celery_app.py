"""The gateway on Celery: one queue per vendor, JSON only, acks_late, prefetch 1.

A task takes one CallRequest, runs it through the WorkerGateway on the process's shared event
loop, and answers with a CallReply: as a step-result task on the queue the request names (the
aggregator's), or pushed onto the Redis list it names (an in-process caller). The message is
acknowledged only after the reply is out (acks_late), so a gateway killed mid-call loses
nothing: the broker hands the message to another gateway, which makes the call again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from celery import Celery, Task
from kombu.exceptions import OperationalError
from pydantic import ValidationError

from conductor.errors import ConductorError, StepCallFailed
from conductor.messaging import (
    CALL_WORKER_TASK,
    STEP_RESULT_TASK,
    CallReply,
    CallRequest,
    ended_channel,
    queue_for,
)
from conductor.pool import Pool
from conductor.ports import ChatWorker
from conductor.workflow import AttemptRecord
from conductor_adapters.loop_thread import LoopThread
from conductor_adapters.queue import OnFirstUse, new_celery_app
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.metrics import GatewayMetrics
from conductor_gateway.quotas_redis import RedisQuotas
from conductor_gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

REPLY_TTL_S = 24 * 3600  # an unread reply is kept a day, then expires
INFRA_RETRIES = 10  # times a task whose reply cannot be delivered is re-queued
# How long a reply already paid for is retried while Redis is unreachable (a restart takes
# seconds; a failover, tens) before its task is re-queued, and its call made again.
REPLY_DELIVERY_S = 300.0
REDIS_CONNECTIONS = 64  # per gateway process; calls queue for one rather than fail
# RPUSH: callers pop from the left, so replies leave in the order they came. (LPUSH made the
# list a stack: under a steady stream old replies sank, one waited 30 s behind newer ones.)
PUSH_REPLY = "redis.call('RPUSH', KEYS[1], ARGV[1]); redis.call('EXPIRE', KEYS[1], ARGV[2])"


class GatewayProcess:
    """What one gateway process holds: the event loop thread, the gateway, a Redis client."""

    def __init__(
        self,
        settings: GatewaySettings,
        pool: Pool,
        workers: Mapping[str, ChatWorker],
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.loop = LoopThread("conductor-gateway-loop")
        self.redis: aioredis.Redis = self.loop.run(self._connect())
        quotas = RedisQuotas(
            self.redis, prefix=settings.redis_prefix, config=settings.quota_config()
        )
        self.gateway = WorkerGateway(
            pool, workers, quotas=quotas, policy=settings.retry_policy(), metrics=metrics
        )
        # One script rather than a MULTI pipeline: redis-py builds each pipeline object at a
        # cost that showed in variants at hundreds of replies a second.
        self._push_reply = self.redis.register_script(PUSH_REPLY)
        # Calls in flight per workflow, cancelled when the aggregator says the workflow ended.
        self._in_flight: dict[str, set[asyncio.Task[Any]]] = {}
        self._ended_calls: set[asyncio.Task[Any]] = set()  # cancelled for that reason
        self._ended_watch = self.loop.run(self._start_ended_watch())

    async def _start_ended_watch(self) -> asyncio.Task[None]:
        return asyncio.create_task(self._watch_ended(), name="ended-workflows")

    async def _watch_ended(self) -> None:
        """Cancel the calls of each workflow the aggregator names as ended; resubscribes after a
        Redis outage (a notice missed then only lets a call finish unused)."""
        channel = ended_channel(self.settings.redis_prefix)
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._cancel_workflow(message["data"].decode())
            except (OSError, aioredis.RedisError) as exc:
                logger.warning("ended-workflow notices lost (%s); subscribing again", exc)
                await asyncio.sleep(1)

    def _cancel_workflow(self, workflow_id: str) -> None:
        for task in self._in_flight.pop(workflow_id, set()):
            self._ended_calls.add(task)
            task.cancel()

    async def _connect(self) -> aioredis.Redis:
        # Created on the loop that will use it: redis.asyncio clients belong to one loop. A
        # blocking pool makes hundreds of concurrent calls queue for a few connections instead
        # of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            self.settings.redis_url, max_connections=REDIS_CONNECTIONS, timeout=30
        )
        return aioredis.Redis(connection_pool=pool)

    def handle(self, request: CallRequest, app: Celery) -> CallReply:
        reply = self.loop.run(self._call(request))
        if request.reply_to is not None:
            self.loop.run(self._deliver(request.reply_to, reply.model_dump_json()))
        else:
            # Publishing retries by itself (task_publish_retry_policy); on RabbitMQ the broker
            # confirms the message before this returns, and only then is the call acked.
            app.send_task(
                STEP_RESULT_TASK, args=[reply.model_dump(mode="json")], queue=request.reply_queue
            )
        return reply

    async def _call(self, request: CallRequest) -> CallReply:
        """The call, counted in flight on its worker's queue while it runs."""
        spec = self.gateway.pool.find(request.worker)
        if self.metrics is None or spec is None:  # an unknown worker fails at once, uncounted
            return await self._answer(request)
        in_flight = self.metrics.in_flight.labels(queue_for(spec))
        in_flight.inc()
        try:
            return await self._answer(request)
        finally:
            in_flight.dec()

    async def _answer(self, request: CallRequest) -> CallReply:
        base = {"call_id": request.call_id, "context": request.context}
        workflow_id = request.context.workflow_id if request.context is not None else None
        task = asyncio.current_task()
        if workflow_id is not None and task is not None:
            self._in_flight.setdefault(workflow_id, set()).add(task)
        left_s = _seconds_left(request)
        if left_s is not None and left_s <= 0:
            # It waited in the queue past its caller's deadline: nobody would read the answer.
            return CallReply(**base, ok=False, error=_expired(request, "before a gateway took it"))
        made: list[AttemptRecord] = []  # the provider calls, as they are made
        try:
            async with asyncio.timeout(left_s):
                result = await self.gateway.call(
                    request.worker,
                    request.messages,
                    allowed_workers=request.allowed_workers,
                    tenant=request.tenant,
                    tools=request.tools,
                    sampling=request.sampling,
                    attempts=made,
                )
            return CallReply(**base, ok=True, result=result, attempts=result.attempts)
        except TimeoutError:
            error = _expired(request, "before it was answered")
            return CallReply(**base, ok=False, error=error, attempts=made)
        except StepCallFailed as exc:
            return CallReply(**base, ok=False, error=str(exc), attempts=exc.attempts)
        except ConductorError as exc:  # unknown worker, bad configuration
            return CallReply(**base, ok=False, error=str(exc))
        except asyncio.CancelledError:
            if task not in self._ended_calls:
                raise  # the process is stopping: the message is redelivered
            # Its workflow ended: the aggregator records only the calls made, which may be
            # billed (429s in a storm included).
            error = "cancelled: its workflow had ended"
            return CallReply(**base, ok=False, error=error, attempts=made)
        finally:
            self._ended_calls.discard(task)
            if workflow_id is not None and task is not None:
                calls = self._in_flight.get(workflow_id)
                if calls is not None:
                    calls.discard(task)
                    if not calls:
                        del self._in_flight[workflow_id]

    async def _deliver(self, reply_to: str, body: str) -> None:
        """Push the reply, retrying here for up to ``REPLY_DELIVERY_S``: a Redis outage must
        not make the provider call again."""
        deadline = time.monotonic() + REPLY_DELIVERY_S
        for attempt in itertools.count():
            try:
                await self._push_reply(keys=[reply_to], args=[body, REPLY_TTL_S])
                return
            except (OSError, aioredis.RedisError) as exc:
                delay = min(0.5 * 2**attempt, 10.0)
                if time.monotonic() + delay > deadline:
                    raise
                logger.warning("cannot push a reply (%s); trying again in %g s", exc, delay)
                await asyncio.sleep(delay)

    def close(self) -> None:
        async def shutdown() -> None:
            self._ended_watch.cancel()
            await asyncio.gather(self._ended_watch, return_exceptions=True)
            await self.gateway.aclose()
            # A client given its pool keeps it open on aclose() unless told: its sockets leaked.
            await self.redis.aclose(close_connection_pool=True)

        self.loop.run(shutdown(), timeout_s=30)
        self.loop.stop()


def _seconds_left(request: CallRequest) -> float | None:
    if request.expires_at is None:
        return None
    return (request.expires_at - datetime.now(UTC)).total_seconds()


def _expired(request: CallRequest, when: str) -> str:
    deadline = request.expires_at.isoformat(timespec="seconds") if request.expires_at else "?"
    return f"worker {request.worker!r}: the caller's deadline ({deadline}) passed {when}"


def create_celery(settings: GatewaySettings, build: Callable[[], GatewayProcess]) -> Celery:
    """The gateway's Celery app; ``build`` makes the process's gateway on the first task, in the
    worker process (never at import)."""
    app = new_celery_app("conductor_gateway", settings)
    register_gateway_tasks(app, settings, build)
    return app


def register_gateway_tasks(
    app: Celery, settings: GatewaySettings, build: Callable[[], GatewayProcess]
) -> None:
    """Add the gateway's task to ``app``; ``build`` makes the process's gateway on first use."""
    process = OnFirstUse(build)

    # shared=False: Celery otherwise adds every task to each app created later in the
    # process (a test process builds several apps; each must hold only its own tasks).
    @app.task(name=CALL_WORKER_TASK, shared=False, bind=True, max_retries=INFRA_RETRIES)
    def call_worker(self: Task[Any, Any], request: dict[str, Any]) -> None:
        try:
            parsed = CallRequest.model_validate(request)
        except ValidationError as exc:
            # Nobody can be answered: without a valid reply_to there is no caller to tell.
            logger.error("dropping a malformed gateway request: %s", exc)
            return
        try:
            process().handle(parsed, app)
        except (OSError, aioredis.RedisError, OperationalError) as exc:
            # Redis stayed unreachable: re-queue, and the call is made again on redelivery.
            logger.error(
                "call %s: Redis or the broker is unreachable (%s); re-queued", parsed.call_id, exc
            )
            raise self.retry(exc=exc, countdown=2) from exc

    app.conf.gateway_process = process  # for shutdown by the worker command


def shutdown(app: Celery) -> None:
    process: GatewayProcess | None = app.conf.gateway_process.pop()
    if process is not None:
        process.close()
