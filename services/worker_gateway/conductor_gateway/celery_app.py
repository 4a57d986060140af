"""The gateway on Celery: one queue per vendor, JSON only, acks_late, prefetch 1.

A task takes one CallRequest, runs it through the WorkerGateway on the process's shared event
loop, and answers with a CallReply: as a step-result task on the queue the request names (the
aggregator's), or pushed onto the Redis list it names (an in-process caller). The message is
acknowledged only after the reply is out (acks_late), so a gateway killed mid-call loses
nothing: the broker hands the message to another gateway, which makes the call again.

A step is paid for once however often it is sent (issue 36 #13). A workflow's step can reach
the gateways more than once: sent again after the broker lost its messages, at its deadline,
or by an outbox whose sender died after sending. Before calling the provider a gateway looks
up the step (``step_key``) in Redis:

- its answer is recorded (``reply_key``, written before the answer is sent): that answer is
  sent again, and the provider is not called;
- another gateway holds its claim (``claim_key``, a lease of ``CLAIM_LEASE_S`` renewed every
  ``CLAIM_RENEW_S`` while the call runs): this one waits for that answer, or for the lease to
  lapse (its holder died) and then claims it;
- neither: it claims the step and calls.

A recorded answer is also listed in ``unapplied_key`` until an aggregator has committed it:
a step result lost on its way (an aggregator killed -9 between the broker handing it over and
kombu recording it as unacknowledged, issue 36 #11) is applied by the aggregators' sweeper.

Redis restarted empty loses the claims and records with the queues. Each gateway process keeps
its claims and the answers it recorded in the last ``HOLD_S`` in memory, and writes them again
when it finds its marker key gone; a resend (a step's second or later send) that finds neither
waits ``RESEND_GRACE_S`` for that before it claims. What a Redis restart repeats is then the
calls in flight at gateways that died with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
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
    claim_key,
    ended_channel,
    queue_for,
    reply_key,
    step_key,
    unapplied_key,
)
from conductor.pool import Pool
from conductor.ports import ChatWorker, DeltaSink
from conductor.tracing import call_span, end_step, step_span
from conductor.workflow import AttemptRecord
from conductor_adapters.answer_streams import append_piece
from conductor_adapters.loop_thread import LoopThread
from conductor_adapters.queue import OnFirstUse, new_celery_app, send
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
# A step's answer, listed as not yet applied, its claim let go: one round trip.
RECORD_REPLY = (
    "redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]); "
    "redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4]); redis.call('DEL', KEYS[3])"
)
# A step's recorded answer if there is one, else its claim taken if nobody holds it: one
# round trip, and atomic (no answer can be recorded between the look and the claim).
CLAIM_STEP = (
    "local answer = redis.call('GET', KEYS[1]); "
    "if answer then return {'answered', answer} end; "
    "if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'claimed', ''} end; "
    "return {'held', ''}"
)
CLAIM_LEASE_S = 4.0  # a dead gateway's claim lapses this long after its last renewal
CLAIM_RENEW_S = 1.0  # also how often a process checks that Redis kept its data
CLAIM_POLL_S = 0.25  # how often a gateway waiting on another's claim looks again
REPLY_KEEP_S = 1800  # a recorded answer outlives the step's deadline (600 s by default)
HOLD_S = 120.0  # answers kept in memory to write again should Redis lose them
CLAIM_TRIES_S = 5.0  # how long a claim is tried while Redis is unreachable before calling anyway
RESEND_GRACE_S = 4.0  # a resend waits up to this for claims and answers a Redis loss took
WATCH_READ_S = 1.0  # the ended-workflow watch's longest wait for a notice, so it sees a close
CLOSE_WAIT_S = 5.0  # how long close() waits for the watch and the keeper to stop


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
        self._record_reply = self.redis.register_script(RECORD_REPLY)
        self._claim_step = self.redis.register_script(CLAIM_STEP)
        # Steps this process calls for (step key -> call id), and answers it recorded lately
        # (step key -> (answer, when)): written again if Redis loses them.
        self._claims: dict[str, str] = {}
        self._recorded: dict[str, tuple[str, float]] = {}
        self._marker = f"{settings.redis_prefix}gateway-alive:{uuid.uuid4().hex}"
        # Calls in flight per workflow, cancelled when the aggregator says the workflow ended.
        self._in_flight: dict[str, set[asyncio.Task[Any]]] = {}
        self._ended_calls: set[asyncio.Task[Any]] = set()  # cancelled for that reason
        # Set by close(): the watch and the keeper stop between their Redis commands (each
        # waits 1 s at most) rather than being cancelled in one, which was seen to hang.
        self._closing = False
        self._ended_watch = self.loop.run(self._start_ended_watch())
        self._keeper = self.loop.run(self._start_keeper())

    async def _start_ended_watch(self) -> asyncio.Task[None]:
        return asyncio.create_task(self._watch_ended(), name="ended-workflows")

    async def _start_keeper(self) -> asyncio.Task[None]:
        with contextlib.suppress(OSError, aioredis.RedisError):  # else the keeper's first look
            await self.redis.set(self._marker, "1", ex=3600)
        return asyncio.create_task(self._keep_claims(), name="step-claims")

    async def _keep_claims(self) -> None:
        """Renew this process's claims; when Redis lost its data (the marker is gone), write
        again the claims and the answers recorded in the last ``HOLD_S``."""
        prefix, lease_ms = self.settings.redis_prefix, int(CLAIM_LEASE_S * 1000)
        pause = CLAIM_RENEW_S
        while not self._closing:
            await asyncio.sleep(pause)
            pause = CLAIM_RENEW_S
            now = time.monotonic()
            for key in [k for k, (_, at) in self._recorded.items() if now - at > HOLD_S]:
                del self._recorded[key]
            try:
                lost = bool(await self.redis.set(self._marker, "1", nx=True, ex=3600))
                await self.redis.expire(self._marker, 3600)
                renew = self.redis.pipeline(transaction=False)
                for key, call_id in list(self._claims.items()):
                    renew.set(claim_key(prefix, key), call_id, px=lease_ms)
                if lost:
                    for key, (body, _) in list(self._recorded.items()):
                        renew.set(reply_key(prefix, key), body, ex=REPLY_KEEP_S, nx=True)
                        renew.zadd(unapplied_key(prefix), {key: time.time()}, nx=True)
                await renew.execute()
                if lost and self._recorded:
                    logger.warning(
                        "Redis lost its data: %d answers and %d claims written again",
                        len(self._recorded),
                        len(self._claims),
                    )
            except (OSError, aioredis.RedisError) as exc:
                # Soon: a Redis back from a restart must see the claims before the resends.
                pause = CLAIM_POLL_S
                logger.warning("cannot renew step claims (%s); trying again", exc)

    async def _watch_ended(self) -> None:
        """Cancel the calls of each workflow the aggregator names as ended; resubscribes after a
        Redis outage (a notice missed then only lets a call finish unused)."""
        channel = ended_channel(self.settings.redis_prefix)
        while not self._closing:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    while not self._closing:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=WATCH_READ_S
                        )
                        if message is not None and message["type"] == "message":
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
        reply = self.loop.run(self._call_once(request))
        if request.reply_to is not None:
            self.loop.run(self._deliver(request.reply_to, reply.model_dump_json()))
        else:
            # Publishing retries by itself (task_publish_retry_policy); on RabbitMQ the broker
            # confirms the message before this returns, and only then is the call acked.
            send(app, STEP_RESULT_TASK, [reply.model_dump(mode="json")], request.reply_queue)
        return reply

    async def _call_once(self, request: CallRequest) -> CallReply:
        """A workflow step's call made once across sends and gateways: its recorded answer if
        there is one, else the call under the step's claim, its answer recorded before it is
        sent. Calls without a step (an in-process caller's) are simply made."""
        if request.context is None:
            return await self._call(request)
        key = step_key(request.context)
        give_up = time.monotonic() + CLAIM_TRIES_S
        while True:
            try:
                stored = await self._claim(request, key)
                break
            except (OSError, aioredis.RedisError) as exc:
                # A connection a Redis restart closed fails once; a Redis away for longer
                # is worth less than the call (quotas wait for it anyway).
                if time.monotonic() > give_up:
                    logger.warning("call %s: cannot claim its step (%s)", request.call_id, exc)
                    return await self._call(request)
                await asyncio.sleep(CLAIM_POLL_S)
        if stored is not None:
            logger.info("call %s: step answered already; not called again", request.call_id)
            return stored
        self._claims[key] = request.call_id
        try:
            reply = await self._call(request)
        except BaseException:
            # Stopping: let the redelivered message claim at once.
            self._claims.pop(key, None)
            await asyncio.shield(self._release(key, request.call_id))
            raise
        self._claims.pop(key, None)
        await self._record(key, reply)
        return reply

    async def _claim(self, request: CallRequest, key: str) -> CallReply | None:
        """Wait until this gateway holds the step's claim (None) or its answer is recorded (the
        answer). A failed answer is not reused: a resend of a failed step tries again."""
        assert request.context is not None
        prefix = self.settings.redis_prefix
        lease_ms = int(CLAIM_LEASE_S * 1000)
        # A resend finding nothing may follow a Redis loss: the gateways holding the step's
        # claim or answer write them again within a renewal or two.
        grace_ends = time.monotonic() + (RESEND_GRACE_S if request.context.dispatch > 1 else 0)
        if request.context.dispatch == 1:  # the usual case, in one round trip
            keys = [reply_key(prefix, key), claim_key(prefix, key)]
            found, stored = await self._claim_step(keys=keys, args=[request.call_id, lease_ms])
            if found == b"claimed":
                return None
            if found == b"answered":
                reply = CallReply.model_validate_json(stored)
                if reply.ok:
                    return reply
            # An answer that failed, or a claim another holds: as for a resend, below.
        while True:
            stored = await self.redis.get(reply_key(prefix, key))
            if stored is not None:
                reply = CallReply.model_validate_json(stored)
                if reply.ok:
                    return reply
            elif time.monotonic() < grace_ends and not await self.redis.exists(
                claim_key(prefix, key)
            ):
                await asyncio.sleep(CLAIM_POLL_S)
                continue
            if await self.redis.set(claim_key(prefix, key), request.call_id, nx=True, px=lease_ms):
                # The holder may have recorded its answer (and let go) since the look above.
                stored = await self.redis.get(reply_key(prefix, key))
                if stored is None:
                    return None
                reply = CallReply.model_validate_json(stored)
                if not reply.ok:
                    return None
                await self.redis.delete(claim_key(prefix, key))
                return reply
            left_s = _seconds_left(request)
            if left_s is not None and left_s <= 0:
                return None  # nobody waits for it any more: _answer says so
            await asyncio.sleep(CLAIM_POLL_S)

    async def _release(self, key: str, call_id: str) -> None:
        try:
            claim = claim_key(self.settings.redis_prefix, key)
            if await self.redis.get(claim) == call_id.encode():
                await self.redis.delete(claim)
        except (OSError, aioredis.RedisError):
            return  # it lapses by itself

    async def _record(self, key: str, reply: CallReply) -> None:
        """Record the step's answer before it is sent; kept in memory for a Redis loss."""
        prefix, body = self.settings.redis_prefix, reply.model_dump_json()
        self._recorded[key] = (body, time.monotonic())
        try:
            await self._record_reply(
                keys=[reply_key(prefix, key), unapplied_key(prefix), claim_key(prefix, key)],
                args=[body, REPLY_KEEP_S, time.time(), key],
            )
        except (OSError, aioredis.RedisError) as exc:
            # The answer still goes out as a message; the keeper writes it if Redis lost it.
            logger.warning("cannot record the answer of step %s (%s)", key, exc)

    def _answer_stream(self, key: str | None) -> DeltaSink | None:
        """Where a streamed answering step's text goes as it is written: the workflow's Redis
        stream, read by the API process that holds its client's stream. A piece Redis cannot
        take is dropped from the live text only: the answer itself still comes whole."""
        if key is None:
            return None
        redis = self.redis

        async def append(text: str) -> None:
            try:
                await append_piece(redis, key, text)
            except (OSError, aioredis.RedisError) as exc:
                logger.warning("cannot stream a piece of %s (%s)", key, exc)

        return append

    async def _call(self, request: CallRequest) -> CallReply:
        """The call, traced under its workflow's span (a step) or its request's (a direct
        call), as its message's ``trace_parent`` says."""
        if request.context is None:
            spans = call_span(request.trace_parent, request.worker)
        else:
            spans = step_span(request.context.step, request.worker, request.trace_parent)
        with spans as span:
            reply = await self._counted_call(request)
            if reply.ok:
                end_step(span, reply.result.cost_usd if reply.result else None, None)
            else:
                end_step(span, None, f"StepCallFailed: {reply.error}")
            return reply

    async def _counted_call(self, request: CallRequest) -> CallReply:
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
                    answer_format=request.answer_format,
                    deltas=self._answer_stream(request.answer_stream),
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
            self._closing = True
            tasks = {self._ended_watch, self._keeper}
            _, stuck = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in stuck:  # a Redis that does not answer: left behind, said
                task.cancel()
                logger.warning("%s did not stop within %g s", task.get_name(), CLOSE_WAIT_S)
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
