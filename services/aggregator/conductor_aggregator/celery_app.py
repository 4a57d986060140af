"""The aggregator on Celery: three tasks on the ``aggregator`` queue, and a deadline sweeper.

Messages are acknowledged after their transaction commits (acks_late). A database or broker
hiccup re-queues the message (a few seconds later) rather than losing it; an unreachable
planner is tried again with backoff before the round fails with the reason. Each process also
runs a sweeper thread that acts on passed deadlines (lost messages, silent workers) and sends
lost start messages again, so no workflow stays running or queued forever.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from kombu.exceptions import OperationalError as BrokerError
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError as DatabaseError

from conductor.errors import PlannerError
from conductor.messaging import (
    CANCEL_WORKFLOW_TASK,
    DELIVER_WEBHOOK_TASK,
    PLAN_ROUND_TASK,
    START_WORKFLOW_TASK,
    STEP_RESULT_TASK,
    CallReply,
)
from conductor_adapters.periodic import Periodic
from conductor_adapters.queue import OnFirstUse, new_celery_app
from conductor_aggregator.service import Aggregator
from conductor_aggregator.settings import AggregatorSettings

logger = logging.getLogger(__name__)

INFRA_ERRORS = (DatabaseError, BrokerError, OSError)
INFRA_RETRIES = 60  # about two minutes of database or broker trouble before a message is dropped
# (the sweeper still finds its workflow at the next deadline)


def create_aggregator_celery(
    settings: AggregatorSettings, build: Callable[[Celery], Aggregator]
) -> Celery:
    """The aggregator's Celery app; ``build`` makes the aggregator on first use, in the worker
    process (never at import)."""
    app = new_celery_app("conductor_aggregator", settings)
    register_aggregator_tasks(app, settings, build)
    return app


def register_aggregator_tasks(
    app: Celery, settings: AggregatorSettings, build: Callable[[Celery], Aggregator]
) -> None:
    """Add the aggregator's tasks to ``app``; ``build`` makes the aggregator on first use."""
    aggregator = OnFirstUse(lambda: build(app))

    def count(kind: str, outcome: str) -> None:
        metrics = aggregator().metrics
        if metrics is not None:
            metrics.messages.labels(kind, outcome).inc()

    def run(task: Task[Any, Any], kind: str, work: Callable[[], None]) -> None:
        try:
            work()
        except INFRA_ERRORS as exc:
            count(kind, "retried")
            logger.warning("%s: %s; the message is re-queued", task.name, exc)
            raise task.retry(exc=exc, countdown=2, max_retries=INFRA_RETRIES) from exc
        count(kind, "ok")

    # shared=False: Celery otherwise adds every task to each app created later in the
    # process (a test process builds several apps; each must hold only its own tasks).
    @app.task(name=START_WORKFLOW_TASK, shared=False, bind=True)
    def start_workflow(self: Task[Any, Any], workflow_id: str) -> None:
        parsed = _workflow_id(workflow_id)
        if parsed is None:
            count("start", "dropped")
        else:
            run(self, "start", lambda: aggregator().start(parsed))

    @app.task(name=PLAN_ROUND_TASK, shared=False, bind=True)
    def plan_round(self: Task[Any, Any], workflow_id: str, round_no: int) -> None:
        parsed = _workflow_id(workflow_id)
        if parsed is None:
            count("plan", "dropped")
            return
        tries = self.request.retries
        final = tries >= settings.planner_retries
        try:
            run(self, "plan", lambda: aggregator().plan(parsed, round_no, final_try=final))
        except PlannerError as exc:  # retryable, and not the final try
            count("plan", "retried")
            delay = min(2.0**tries, 30.0)
            logger.warning("planning %s: %s; trying again in %g s", workflow_id, exc, delay)
            retries = settings.planner_retries
            raise self.retry(exc=exc, countdown=delay, max_retries=retries) from exc

    @app.task(name=CANCEL_WORKFLOW_TASK, shared=False, bind=True)
    def cancel_workflow(self: Task[Any, Any], workflow_id: str, reason: str) -> None:
        parsed = _workflow_id(workflow_id)
        if parsed is None:
            count("cancel", "dropped")
        else:
            run(self, "cancel", lambda: aggregator().cancel(parsed, reason[:500]))

    @app.task(name=DELIVER_WEBHOOK_TASK, shared=False, bind=True)
    def deliver_webhook(self: Task[Any, Any], delivery_id: str) -> None:
        run(self, "webhook", lambda: aggregator().deliver_webhook(delivery_id[:40]))

    @app.task(name=STEP_RESULT_TASK, shared=False, bind=True)
    def step_result(self: Task[Any, Any], reply: dict[str, Any]) -> None:
        try:
            parsed = CallReply.model_validate(reply)
        except ValidationError as exc:
            logger.error("dropping a malformed step result: %s", exc)
            count("step_result", "dropped")
            return
        run(self, "step_result", lambda: aggregator().step_result(parsed))

    app.conf.aggregator_get = aggregator


def _workflow_id(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        logger.error("dropping a message for a malformed workflow id %r", text)
        return None


def sweeper(aggregator: Callable[[], Aggregator], interval_s: float) -> Periodic:
    """A thread that calls ``Aggregator.sweep`` every ``interval_s`` once started."""
    return Periodic("conductor-sweeper", lambda: aggregator().sweep(), interval_s)


def shutdown(app: Celery) -> None:
    aggregator: Aggregator | None = app.conf.aggregator_get.pop()
    if aggregator is not None:
        aggregator.close()
