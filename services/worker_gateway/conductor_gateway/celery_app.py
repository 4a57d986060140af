"""The gateway on Celery (CONVENTIONS 8): one queue per vendor, JSON only, acks_late, prefetch 1.

A task takes one CallRequest, runs it through the WorkerGateway on the process's shared event
loop, and pushes a CallReply onto the Redis list the request names. The message is acknowledged
only after the reply is pushed (acks_late), so a gateway killed mid-call loses nothing: the
broker hands the message to another gateway, which makes the call again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import redis.asyncio as aioredis
from celery import Celery, Task
from pydantic import ValidationError

from conductor.errors import ConductorError, ConfigurationError
from conductor.llamacpp import EngineOptions
from conductor.ports import StepCallFailed
from conductor.settings import Settings, get_settings, load_pool
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.loop_thread import LoopThread
from conductor_gateway.messages import CALL_WORKER_TASK, CallReply, CallRequest
from conductor_gateway.quotas_redis import RedisQuotas
from conductor_gateway.registry import build_workers
from conductor_gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

REPLY_TTL_S = 24 * 3600  # an unread reply is kept a day, then expires
INFRA_RETRIES = 10  # times a task whose reply cannot be delivered is re-queued
REPLY_ATTEMPTS = 8  # about a minute of Redis being unreachable before the task is re-queued
REDIS_CONNECTIONS = 64  # per gateway process; calls queue for one rather than fail
PUSH_REPLY = "redis.call('LPUSH', KEYS[1], ARGV[1]); redis.call('EXPIRE', KEYS[1], ARGV[2])"


def celery_config(settings: GatewaySettings) -> dict[str, Any]:
    if not settings.broker_url:
        # Never fall back to eager mode silently: without a broker there is no gateway.
        raise ConfigurationError(
            "CONDUCTOR_BROKER_URL is not set: the gateway needs a Celery broker "
            "(redis://... or amqp://...)"
        )
    transport_options: dict[str, Any] = {}
    if settings.broker_url.startswith(("redis://", "rediss://")):
        transport_options = {
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "global_keyprefix": settings.redis_prefix,
        }
    return {
        "broker_url": settings.broker_url,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "task_ignore_result": True,  # replies go to the caller's Redis list
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "task_create_missing_queues": True,
        "broker_transport_options": transport_options,
        "worker_hijack_root_logger": False,
    }


class GatewayProcess:
    """What one gateway process holds: the event loop thread, the gateway, a Redis client."""

    def __init__(self, settings: GatewaySettings, app_settings: Settings) -> None:
        self.settings = settings
        self.loop = LoopThread()
        pool = load_pool(app_settings)
        workers = build_workers(pool, EngineOptions.from_settings(app_settings))
        self.redis: aioredis.Redis = self.loop.run(self._connect())
        quotas = RedisQuotas(
            self.redis, prefix=settings.redis_prefix, config=settings.quota_config()
        )
        self.gateway = WorkerGateway(pool, workers, quotas=quotas, policy=settings.retry_policy())
        # One script rather than a MULTI pipeline: redis-py builds each pipeline object at a
        # cost that showed in profiles at hundreds of replies a second.
        self._push_reply = self.redis.register_script(PUSH_REPLY)

    async def _connect(self) -> aioredis.Redis:
        # Created on the loop that will use it: redis.asyncio clients belong to one loop. A
        # blocking pool makes hundreds of concurrent calls queue for a few connections instead
        # of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            self.settings.redis_url, max_connections=REDIS_CONNECTIONS, timeout=30
        )
        return aioredis.Redis(connection_pool=pool)

    def handle(self, request: CallRequest) -> CallReply:
        return self.loop.run(self._handle(request))

    async def _handle(self, request: CallRequest) -> CallReply:
        try:
            result = await self.gateway.call(request.worker, request.messages)
            reply = CallReply(
                call_id=request.call_id, ok=True, result=result, attempts=result.attempts
            )
        except StepCallFailed as exc:
            reply = CallReply(
                call_id=request.call_id, ok=False, error=str(exc), attempts=exc.attempts
            )
        except ConductorError as exc:  # unknown worker, bad configuration
            reply = CallReply(call_id=request.call_id, ok=False, error=str(exc))
        await self._deliver(request.reply_to, reply.model_dump_json())
        return reply

    async def _deliver(self, reply_to: str, body: str) -> None:
        """Push the reply, retrying here: a Redis blip must not make the provider call again."""
        for attempt in range(REPLY_ATTEMPTS):
            try:
                await self._push_reply(keys=[reply_to], args=[body, REPLY_TTL_S])
                return
            except (OSError, aioredis.RedisError) as exc:
                if attempt == REPLY_ATTEMPTS - 1:
                    raise
                logger.warning("cannot push a reply (%s); trying again", exc)
                await asyncio.sleep(min(0.5 * 2**attempt, 10))

    def close(self) -> None:
        async def shutdown() -> None:
            await self.gateway.aclose()
            await self.redis.aclose()

        self.loop.run(shutdown(), timeout_s=30)
        self.loop.stop()


def create_celery(settings: GatewaySettings | None = None) -> Celery:
    """The gateway's Celery app; the gateway itself is built on the first task, in the worker."""
    settings = settings or GatewaySettings.load()
    app = Celery("conductor_gateway")
    app.conf.update(celery_config(settings))
    holder: dict[str, GatewayProcess] = {}
    lock = threading.Lock()

    def process() -> GatewayProcess:
        with lock:
            if "process" not in holder:
                holder["process"] = GatewayProcess(settings, get_settings())
            return holder["process"]

    @app.task(name=CALL_WORKER_TASK, bind=True, max_retries=INFRA_RETRIES)
    def call_worker(self: Task[Any, Any], request: dict[str, Any]) -> None:
        try:
            parsed = CallRequest.model_validate(request)
        except ValidationError as exc:
            # Nobody can be answered: without a valid reply_to there is no caller to tell.
            logger.error("dropping a malformed gateway request: %s", exc)
            return
        try:
            process().handle(parsed)
        except (OSError, aioredis.RedisError) as exc:
            # Redis stayed unreachable: re-queue, and the call is made again on redelivery.
            logger.error("call %s: cannot reply (%s); re-queued", parsed.call_id, exc)
            raise self.retry(exc=exc, countdown=2) from exc

    app.conf.gateway_process = holder  # for shutdown by the worker command
    return app


def shutdown(app: Celery) -> None:
    holder: dict[str, GatewayProcess] = app.conf.gateway_process
    process = holder.pop("process", None)
    if process is not None:
        process.close()
