"""Celery plumbing every distributed role shares: one configuration, and per-process parts.

The queue contract itself (task names, queues, message models) is the core's
(``conductor.messaging``); this is how the services put it on a Celery broker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import redis
from celery import Celery

from conductor.errors import ConfigurationError
from conductor_adapters.redis_broker import TRANSPORT_PATH
from conductor_adapters.settings import BrokerSettings

T = TypeVar("T")


def restore_interval_s(visibility_timeout_s: int) -> int:
    """How often consumers of the Redis broker look for messages whose consumer died: a sixth
    of the visibility timeout, between 1 and 10 s."""
    return max(1, min(10, visibility_timeout_s // 6))


def celery_config(settings: BrokerSettings) -> dict[str, Any]:
    """What every Conductor Celery app shares: JSON only, acks_late (a message is acknowledged
    only after its work is done, so a killed process loses nothing),
    prefetch 1, no result backend (answers travel as messages)."""
    if not settings.broker_url:
        # Never fall back to eager mode silently: without a broker there is no distributed mode.
        raise ConfigurationError(
            "CONDUCTOR_BROKER_URL is not set: distributed mode needs a Celery broker "
            "(redis://... or amqp://...)"
        )
    transport_options: dict[str, Any] = {}
    transport: str | None = None  # from the URL's scheme
    if settings.broker_url.startswith("redis://"):
        transport = TRANSPORT_PATH  # kombu's, sharing one client per channel
    if settings.broker_url.startswith(("redis://", "rediss://")):
        transport_options = {
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "global_keyprefix": settings.redis_prefix,
            # kombu looks for messages past their visibility timeout every 10 s but scans only
            # on every 10th look by default: a killed consumer's message came back up to ~100 s
            # late. Scanning on every look (a cheap sorted-set range query) bounds redelivery
            # by the timeout plus the interval.
            "unacked_restore_interval": restore_interval_s(settings.broker_visibility_timeout_s),
            "unacked_restore_throttle": 1,
        }
    elif settings.broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        # The broker confirms each message before send_task returns: nothing is acked on the
        # strength of a message that never reached it.
        transport_options = {"confirm_publish": True}
    return {
        "broker_url": settings.broker_url,
        "broker_transport": transport,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "task_create_missing_queues": True,
        "broker_transport_options": transport_options,
        "worker_hijack_root_logger": False,
        "task_publish_retry_policy": {
            "max_retries": 30,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 3,
        },
    }


def send(app: Celery, task: str, args: list[Any], queue: str | None, **options: Any) -> None:
    """Publish a task message. Celery would also write a repr of its arguments into the
    message's headers (shown by its events and tools such as Flower): a second copy, up to
    1 KB, of the question, the context or the answer a step carries, made by a pure-Python
    repr on every send. The headers say it is not shown instead."""
    app.send_task(
        task, args=args, queue=queue, argsrepr="<not shown>", kwargsrepr="<not shown>",
        **options,
    )  # fmt: skip


def new_celery_app(name: str, settings: BrokerSettings) -> Celery:
    app = Celery(name)
    app.conf.update(celery_config(settings))
    return app


class OnFirstUse(Generic[T]):
    """A process's heavy part (models, pools, clients), built by whichever task thread needs it
    first, exactly once; built in the worker process, never at import."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T:
        with self._lock:
            if self._value is None:
                self._value = self._build()
            return self._value

    def pop(self) -> T | None:
        """The built part, now forgotten (for shutdown); None if it was never built."""
        with self._lock:
            value, self._value = self._value, None
            return value


class RedisBrokerWatch:
    """Tells when the Redis behind the broker lost its data (restarted without persistence):
    the queued messages went with it, so what was in flight must be sent again.

    A marker key is written in that Redis; finding it gone means the data was lost (or that
    this is the first look ever, when nothing is in flight). The first process to write the
    marker again is told, the others are not, so one aggregator replica does the resending.
    """

    def __init__(self, broker_url: str, prefix: str) -> None:
        self._client = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
        self._marker = f"{prefix}broker-alive"

    def lost_data(self) -> bool:
        """True once per loss (to one caller); False also while Redis cannot be reached."""
        try:
            return bool(self._client.set(self._marker, "1", nx=True))
        except (redis.RedisError, OSError):
            return False

    def close(self) -> None:
        self._client.close()


def broker_watch(settings: BrokerSettings) -> RedisBrokerWatch | None:
    """The watch for a Redis broker; None for RabbitMQ, whose queues are durable."""
    url = settings.broker_url or ""
    if not url.startswith(("redis://", "rediss://")):
        return None
    return RedisBrokerWatch(url, settings.redis_prefix)


def queue_depths(app: Celery, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each of ``queues`` (not those a consumer holds unacknowledged).

    RabbitMQ answers a passive declare. kombu's Redis transport counts its lists (every
    priority) with ``_size``: its passive declare asks whether the queue exists without the
    global key prefix, so with a prefix it says no queue exists at all. A queue that does not
    exist yet holds nothing."""
    depths: dict[str, int] = {}
    with app.connection_for_read() as connection:
        for queue in queues:
            channel: Any = connection.channel()  # kombu types it as StdChannel, sans declare
            try:
                size = getattr(channel, "_size", None)
                if size is not None:
                    depths[queue] = int(size(queue))
                else:
                    declared = channel.queue_declare(queue=queue, passive=True)
                    depths[queue] = int(declared.message_count)
            except Exception as exc:  # RabbitMQ closes the channel: 404 NOT_FOUND
                if getattr(exc, "code", None) != 404 and "NOT_FOUND" not in str(exc):
                    raise
                depths[queue] = 0
            finally:
                _close_quietly(channel)
    return depths


def _close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # a channel RabbitMQ closed on a missing queue is closed already
        return
