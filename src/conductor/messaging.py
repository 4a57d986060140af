"""The queue contract between the services (JSON only): task names, queues and messages.

The aggregator sends a step to ``gateway.<vendor>``; the gateway answers on the queue the
request names (the aggregator's) or on a Redis list (a caller waiting in-process). A request
names its worker; it never carries a key (gateways read keys from their own environment) nor
a price (the gateway's pool file is the price table).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

from celery import Celery
from pydantic import BaseModel, ConfigDict, Field, model_validator

from conductor.chat import ChatMessage
from conductor.errors import ConfigurationError
from conductor.pool import WorkerSpec
from conductor.ports import StepCallResult
from conductor.settings import BrokerSettings
from conductor.workflow import AttemptRecord

T = TypeVar("T")

CALL_WORKER_TASK = "conductor.gateway.call_worker"
AGGREGATOR_QUEUE = "aggregator"
START_WORKFLOW_TASK = "conductor.aggregator.start_workflow"
PLAN_ROUND_TASK = "conductor.aggregator.plan_round"
STEP_RESULT_TASK = "conductor.aggregator.step_result"
MAX_MESSAGES = 200


def queue_for(spec: WorkerSpec) -> str:
    """One queue per vendor, so each scales on its own: ``gateway.openai``, ``gateway.gemini``."""
    return f"gateway.{spec.provider.value}"


class StepContext(BaseModel):
    """Which step a call is for; the gateway hands it back untouched with the reply."""

    model_config = ConfigDict(extra="forbid")

    workflow_id: str
    step: int = Field(ge=0)
    dispatch: int = Field(ge=1)


class CallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=200)
    worker: str
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    # Exactly one of: a Redis list to push the reply onto, or a queue to send it to as a
    # STEP_RESULT_TASK.
    reply_to: str | None = Field(default=None, min_length=1, max_length=300)
    reply_queue: str | None = Field(default=None, min_length=1, max_length=200)
    context: StepContext | None = None

    @model_validator(mode="after")
    def _one_reply_route(self) -> Self:
        if (self.reply_to is None) == (self.reply_queue is None):
            raise ValueError("name exactly one of reply_to (a Redis list) and reply_queue")
        return self


class CallReply(BaseModel):
    call_id: str
    ok: bool
    result: StepCallResult | None = None
    error: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    context: StepContext | None = None


def celery_config(settings: BrokerSettings) -> dict[str, Any]:
    """What every Conductor Celery app shares (CONVENTIONS 8): JSON only, acks_late,
    prefetch 1, no result backend (answers travel as messages)."""
    if not settings.broker_url:
        # Never fall back to eager mode silently: without a broker there is no distributed mode.
        raise ConfigurationError(
            "CONDUCTOR_BROKER_URL is not set: distributed mode needs a Celery broker "
            "(redis://... or amqp://...)"
        )
    transport_options: dict[str, Any] = {}
    if settings.broker_url.startswith(("redis://", "rediss://")):
        transport_options = {
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "global_keyprefix": settings.redis_prefix,
        }
    elif settings.broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        # The broker confirms each message before send_task returns: nothing is acked on the
        # strength of a message that never reached it.
        transport_options = {"confirm_publish": True}
    return {
        "broker_url": settings.broker_url,
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
