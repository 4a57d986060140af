"""Workflows in distributed mode: submitting one, and the row each aggregator locks to run it.

A submitted workflow is a ``workflow`` trace row (status "queued") plus a ``workflow_run`` row
holding the request, written in one transaction with its start message, staged in the outbox
(conductor_adapters.store.outbox): the message is sent after the commit, by the submitter or
its relay, else by an aggregator's sweeper, so it never arrives before the workflow it starts
and a broker that is down delays it without losing it. If it is lost in the broker, the
sweeper sends it again once ``next_deadline_at`` passes, so a submitted workflow is never
forgotten. Aggregators serialise their changes to a workflow with one row
lock (``SELECT ... FOR UPDATE`` on its ``workflow_run`` row).
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from sqlalchemy import Connection, Engine, Select, bindparam, func, insert, select, text, update
from sqlalchemy.exc import SQLAlchemyError

from conductor.answer_format import AnswerFormat
from conductor.chat import ToolUse
from conductor.machine import WorkflowMachine, WorkflowState, utcnow
from conductor.messaging import AGGREGATOR_QUEUE, CANCEL_WORKFLOW_TASK, START_WORKFLOW_TASK
from conductor.orchestration import check_question
from conductor.variants import Variant
from conductor.workflow import WorkflowStatus
from conductor_adapters.outbox_relay import send_staged
from conductor_adapters.periodic import Periodic
from conductor_adapters.queue import send
from conductor_adapters.store import outbox
from conductor_adapters.store.models import new_workflow_values, run_table, workflow_table

logger = logging.getLogger(__name__)

START_GRACE_S = 30.0  # a queued workflow not started by then has its start message sent again
# A queued run an aggregator plans before it starts it (``take_to_plan``) is dated this far
# ahead, and again every ``PLAN_LEASE_RENEW_S`` while that process lives (``PlanLeases``): a
# sweeper sends its start again within about ``PLAN_LEASE_S`` of the process's death.
PLAN_LEASE_S = 10.0
PLAN_LEASE_RENEW_S = 2.0


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str
    # Runs submitted before the rename stored "profile".
    variant: Variant = Field(validation_alias=AliasChoices("variant", "profile"))
    # Names of the workers the Conductor may use; None: every worker the aggregator can call.
    pool: list[str] | None = None
    tenant: str = "default"
    metadata: dict[str, str] = Field(default_factory=dict)
    # The form the answer must take (response_format); None: any text.
    answer_format: AnswerFormat | None = None
    # The client's functions, offered to the step that writes the answer; None: no tools.
    tools: ToolUse | None = None
    # Whether its client streams the answer (its text then goes out as it is written).
    stream_answer: bool = False
    # The API key that submitted it, whose limits count it; None: none did.
    key_id: str | None = None
    # Where its outcome is delivered (a webhook signed with its key's secret); None: the
    # key's default webhook URL, if it has one.
    callback_url: str | None = None
    # A client's Idempotency-Key and the SHA-256 of the request it came with (both or none).
    idempotency_key: str | None = None
    request_hash: str | None = None
    # The W3C traceparent of the request that submitted it: its workflow's span goes under
    # it (None: not traced, or a trace of its own).
    trace_parent: str | None = Field(default=None, max_length=128)


class RunRow(BaseModel):
    workflow_id: uuid.UUID
    status: str
    request: SubmitRequest
    state: WorkflowState | None
    created_at: datetime


def submit_workflow(
    engine: Engine,
    app: Celery,
    request: SubmitRequest,
    *,
    workflow_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """Record the workflow as queued with its start message, then send that message, waiting
    for the broker (the API hands it to its relay instead: ``stage_submission``).

    The rows are committed before the message is sent: an aggregator never receives a start
    for a workflow it cannot find. A start the broker refused stays in the outbox, and an
    aggregator's sweeper sends it.
    """
    workflow_id, staged = stage_submission(engine, request, workflow_id=workflow_id)
    outbox.sent(engine, send_staged(app, [staged]))
    return workflow_id


def stage_submission(
    engine: Engine, request: SubmitRequest, *, workflow_id: uuid.UUID | None = None
) -> tuple[uuid.UUID, outbox.Staged]:
    """Record the workflow as queued and stage its start message, in one transaction; the
    caller sends it (or leaves it to the sweepers)."""
    check_question(request.question)
    workflow_id = workflow_id or uuid.uuid4()
    now = utcnow()
    with engine.begin() as conn:
        record_submission(conn, request, workflow_id, now)
        [staged] = outbox.stage(conn, workflow_id, [start_message(workflow_id)], now)
    return workflow_id, staged


def stage_cancel(engine: Engine, workflow_id: uuid.UUID, reason: str) -> outbox.Staged:
    """Stage a request that the aggregators end the workflow cancelled."""
    message = outbox.Message(CANCEL_WORKFLOW_TASK, AGGREGATOR_QUEUE, [str(workflow_id), reason])
    with engine.begin() as conn:
        [staged] = outbox.stage(conn, workflow_id, [message], utcnow())
    return staged


def start_message(workflow_id: uuid.UUID) -> outbox.Message:
    return outbox.Message(START_WORKFLOW_TASK, AGGREGATOR_QUEUE, [str(workflow_id)])


_INSERT_WORKFLOW = insert(workflow_table)  # built once, compiled once


def record_workflow(
    conn: Connection,
    request: SubmitRequest,
    workflow_id: uuid.UUID,
    now: datetime,
    *,
    runner_id: str | None = None,
) -> None:
    """The workflow's trace row, "queued", with its tenant and labels (both modes); in the
    embedded runtime, with the runner that runs it."""
    row = new_workflow_values(
        workflow_id,
        tenant=request.tenant,
        variant=request.variant.name,
        question=request.question,
        status=WorkflowStatus.QUEUED.value,
        created_at=now,
        labels=request.metadata,
        runner_id=runner_id,
    )
    row["idempotency_key"] = request.idempotency_key
    row["request_hash"] = request.request_hash
    row["key_id"] = request.key_id
    row["callback_url"] = request.callback_url
    conn.execute(_INSERT_WORKFLOW, row)


def record_submission(
    conn: Connection, request: SubmitRequest, workflow_id: uuid.UUID, now: datetime
) -> None:
    """The trace row and the run row an aggregator locks (distributed mode)."""
    record_workflow(conn, request, workflow_id, now)
    conn.execute(
        _INSERT_RUN,
        {
            "workflow_id": workflow_id,
            "status": WorkflowStatus.QUEUED.value,
            "request": request.model_dump(mode="json"),
            "state": None,
            "next_deadline_at": now + timedelta(seconds=START_GRACE_S),
            "updated_at": now,
        },
    )


def send_start(app: Celery, workflow_id: uuid.UUID) -> None:
    send(app, START_WORKFLOW_TASK, [str(workflow_id)], AGGREGATOR_QUEUE)


def lock_run(conn: Connection, workflow_id: uuid.UUID) -> RunRow | None:
    """The run, locked until the transaction ends (one aggregator at a time per workflow)."""
    return _run_row(conn, _LOCK_RUN, workflow_id)


def load_run(conn: Connection, workflow_id: uuid.UUID) -> RunRow | None:
    """The run as it is now, unlocked: for reads that do not change it."""
    return _run_row(conn, _LOAD_RUN, workflow_id)


# Built once and run with parameters: the aggregator runs them on every message.
_INSERT_RUN = insert(run_table)
_LOAD_RUN = (
    select(run_table, workflow_table.c.created_at)
    .join(workflow_table, workflow_table.c.id == run_table.c.workflow_id)
    .where(run_table.c.workflow_id == bindparam("workflow"))
)
_LOCK_RUN = _LOAD_RUN.with_for_update(of=run_table)
_SAVE_RUN = (
    update(run_table)
    .where(run_table.c.workflow_id == bindparam("workflow"))
    .values(
        status=bindparam("new_status"),
        state=bindparam("new_state"),
        next_deadline_at=bindparam("new_deadline"),
        updated_at=bindparam("new_updated_at"),
    )
)


def _run_row(conn: Connection, query: Select[Any], workflow_id: uuid.UUID) -> RunRow | None:
    row = conn.execute(query, {"workflow": workflow_id}).mappings().one_or_none()
    if row is None:
        return None
    state = WorkflowState.model_validate(row["state"]) if row["state"] is not None else None
    return RunRow(
        workflow_id=row["workflow_id"],
        status=row["status"],
        request=SubmitRequest.model_validate(row["request"]),
        state=state,
        created_at=row["created_at"],
    )


def save_run(conn: Connection, workflow_id: uuid.UUID, state: WorkflowState) -> None:
    conn.execute(
        _SAVE_RUN,
        {
            "workflow": workflow_id,
            "new_status": state.result.status.value,
            "new_state": state.model_dump(mode="json"),
            "new_deadline": WorkflowMachine(state).next_deadline(),
            "new_updated_at": utcnow(),
        },
    )


# A run not started: its state is the JSON null its submission wrote (SQL NULL counts too).
_NOT_STARTED = func.coalesce(func.jsonb_typeof(run_table.c.state), "null") == "null"


def postpone_start(conn: Connection, workflow_id: uuid.UUID, now: datetime) -> None:
    """Date a queued run's start message, sent again, ``START_GRACE_S`` ahead; queued once
    more, it is for whoever takes that message to plan (``take_to_plan``)."""
    conn.execute(
        update(run_table)
        .where(run_table.c.workflow_id == workflow_id, _NOT_STARTED)
        .values(
            status=WorkflowStatus.QUEUED.value,
            next_deadline_at=now + timedelta(seconds=START_GRACE_S),
            updated_at=now,
        )
    )


def take_to_plan(conn: Connection, workflow_id: uuid.UUID, now: datetime) -> RunRow | None:
    """A queued run, for this process to plan its first round before it starts it (one
    transaction then records both): marked running (its trace row too) and leased, dated
    ``PLAN_LEASE_S`` ahead, which the caller's ``PlanLeases`` renews. None when it is not
    queued: started already, planned by another process now (a repeated start message), or
    not here. A lease its process stopped renewing lapses: the sweepers then send the start
    message again (``postpone_start``), and whoever takes it plans."""
    row = (
        conn.execute(
            _TAKE_TO_PLAN,
            {
                "workflow": workflow_id,
                "now": now,
                "until": now + timedelta(seconds=PLAN_LEASE_S),
                "queued": WorkflowStatus.QUEUED.value,
                "running": WorkflowStatus.RUNNING.value,
            },
        )
        .mappings()
        .one_or_none()
    )
    if row is None:
        return None
    return RunRow(
        workflow_id=row["workflow_id"],
        status=WorkflowStatus.RUNNING.value,
        request=SubmitRequest.model_validate(row["request"]),
        state=None,
        created_at=row["created_at"],
    )


# One statement (a round trip, where a transaction of its own took five): the run is taken if
# it is queued, or if the process that took it stopped renewing its lease.
_TAKE_TO_PLAN = text(
    """
    WITH taken AS (
        UPDATE workflow_run
        SET status = :running, next_deadline_at = :until, updated_at = :now
        WHERE workflow_id = :workflow AND COALESCE(jsonb_typeof(state), 'null') = 'null'
            AND (status = :queued OR next_deadline_at <= :now)
        RETURNING workflow_id, request
    ), shown AS (
        UPDATE workflow SET status = :running
        WHERE id IN (SELECT workflow_id FROM taken) AND status = :queued
    )
    SELECT taken.workflow_id, taken.request, workflow.created_at
    FROM taken JOIN workflow ON workflow.id = taken.workflow_id
    """
)


class PlanLeases:
    """The queued runs this process plans (``take_to_plan``), dated ahead again every
    ``PLAN_LEASE_RENEW_S`` by a thread of their own while it lives. Renewals that stall (the
    database away) only let a sweeper send the start again while its process still plans,
    which costs a second plan at most: the first to commit starts the workflow, and the other
    finds it started."""

    def __init__(self, engine: Engine, interval_s: float = PLAN_LEASE_RENEW_S) -> None:
        self._engine = engine
        self._ids: set[uuid.UUID] = set()
        self._lock = threading.Lock()
        self._thread = Periodic("conductor-plan-leases", self.renew, interval_s).start()

    def hold(self, workflow_id: uuid.UUID) -> None:
        with self._lock:
            self._ids.add(workflow_id)

    def release(self, workflow_id: uuid.UUID) -> None:
        with self._lock:
            self._ids.discard(workflow_id)

    def renew(self) -> int:
        """Date the held runs ahead again; how many are held."""
        with self._lock:
            ids = sorted(self._ids)
        if not ids:
            return 0
        until = utcnow() + timedelta(seconds=PLAN_LEASE_S)
        try:
            with self._engine.begin() as conn:
                conn.execute(_RENEW_PLAN_LEASES, {"ids": ids, "until": until})
        except SQLAlchemyError as exc:
            logger.warning("cannot renew the leases of %d runs being planned (%s)", len(ids), exc)
        return len(ids)

    def close(self) -> None:
        self._thread.stop()


_RENEW_PLAN_LEASES = (
    update(run_table)
    .where(
        run_table.c.workflow_id.in_(bindparam("ids", expanding=True)),
        _NOT_STARTED,
    )
    .values(next_deadline_at=bindparam("until"))
)


def give_up_plan(engine: Engine, workflow_id: uuid.UUID) -> None:
    """Queue again a run this process took to plan and could not start (its change failed):
    its start message, delivered again, is taken at once rather than after the lease.
    Best effort: failing, the lease lapses and a sweeper sends the start."""
    try:
        with engine.begin() as conn:
            conn.execute(
                update(run_table)
                .where(run_table.c.workflow_id == workflow_id, _NOT_STARTED)
                .values(status=WorkflowStatus.QUEUED.value, next_deadline_at=utcnow())
            )
    except SQLAlchemyError as exc:
        logger.warning("cannot queue workflow %s again (%s)", workflow_id, exc)


def active_runs(conn: Connection) -> list[uuid.UUID]:
    """Every workflow queued or running."""
    active = [WorkflowStatus.QUEUED.value, WorkflowStatus.RUNNING.value]
    query = select(run_table.c.workflow_id).where(run_table.c.status.in_(active))
    return list(conn.execute(query).scalars())


def due_runs(conn: Connection, now: datetime, limit: int = 100) -> list[uuid.UUID]:
    """Unfinished runs whose next deadline has passed, earliest first."""
    query = (
        select(run_table.c.workflow_id)
        .where(run_table.c.status.in_([WorkflowStatus.QUEUED.value, WorkflowStatus.RUNNING.value]))
        .where(run_table.c.next_deadline_at <= now)
        .order_by(run_table.c.next_deadline_at)
        .limit(limit)
    )
    return list(conn.execute(query).scalars())
