"""The trace store: a WorkflowObserver that writes each workflow, step and attempt to SQL.

Writes are idempotent so that redelivered events (Celery ``acks_late``, a resumed aggregator)
are harmless: rows are inserted with ON CONFLICT DO NOTHING, and a step or workflow that has
reached a terminal status is never written again (the first final write wins). A workflow's
start and its outcome create its row if it is missing, and the outcome records every plan and
finished step, so a store attached late still keeps a whole trace.

Row values are built on the event loop before the SQL runs in a thread, because the executor
keeps mutating the records of parallel steps while a write is in flight.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BindParameter, Connection, Engine, bindparam, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from conductor.machine import EventKind, MachineEvent, event_row, event_subject, utcnow
from conductor.pool import Pool
from conductor.workflow import (
    TERMINAL_STEP_STATUSES,
    TERMINAL_WORKFLOW_STATUSES,
    AttemptRecord,
    PlanOutcome,
    StepRecord,
    StepStatus,
    WorkflowRecord,
    WorkflowStatus,
)
from conductor_adapters.store.group_commit import GroupCommit, Write
from conductor_adapters.store.models import (
    AttemptRow,
    StepRow,
    WorkflowRow,
    attempt_table,
    event_table,
    new_workflow_values,
    step_table,
    workflow_table,
)
from conductor_adapters.store.redact import (
    redact_strings,
    redact_text,
    scrub_snapshot,
    secret_values,
)
from conductor_adapters.webhooks import DELIVERY_TARGET, record_delivery

Row = dict[str, Any]


def _aware(value: datetime | None) -> datetime | None:
    """Naive datetimes are taken as UTC rather than losing the trace to a ValueError."""
    if value is None or value.utcoffset() is not None:
        return value
    return value.replace(tzinfo=UTC)


def _workflow_row(result: WorkflowRecord, tenant: str, snapshot: list[dict[str, Any]]) -> Row:
    return new_workflow_values(
        result.workflow_id,
        tenant=tenant,
        variant=result.variant,
        question=result.question,
        status=WorkflowStatus.RUNNING.value,
        created_at=_aware(result.created_at),
        pool_snapshot=snapshot,
    )


USAGE_COLUMNS = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "total_tokens",
    "cost_usd",
)


FINAL_WORKFLOW_COLUMNS = ("status", "answer", *USAGE_COLUMNS, "latency_ms", "error", "finished_at")


def _final_workflow_values(result: WorkflowRecord, secrets: list[str]) -> Row:
    return {
        "status": result.status.value,
        "answer": result.answer,
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "cached_tokens": result.usage.cached_tokens,
        "reasoning_tokens": result.usage.reasoning_tokens,
        "total_tokens": result.usage.total_tokens,
        "cost_usd": result.cost_usd,
        "latency_ms": result.latency_ms,
        "error": redact_text(result.error, secrets),
        "finished_at": _aware(result.finished_at) or datetime.now(UTC),
    }


def _step_row(step: StepRecord, secrets: list[str], status: StepStatus | None = None) -> Row:
    return {
        "index": step.index,
        "round": step.round,
        "kind": step.kind.value,
        "worker": step.worker,
        "subtask": step.subtask,
        "access_list": list(step.access_list),
        "visible_steps": list(step.visible_steps),
        "status": (status or step.status).value,
        "output": step.output,
        "tool_calls": [call.model_dump() for call in step.tool_calls],
        "prompt_tokens": step.usage.prompt_tokens,
        "completion_tokens": step.usage.completion_tokens,
        "cached_tokens": step.usage.cached_tokens,
        "reasoning_tokens": step.usage.reasoning_tokens,
        "total_tokens": step.usage.total_tokens,
        "cost_usd": step.cost_usd,
        "latency_ms": step.latency_ms,
        "started_at": _aware(step.started_at),
        "finished_at": _aware(step.finished_at),
        "error": redact_text(step.error, secrets),
    }


def _attempt_row(attempt: AttemptRecord, secrets: list[str]) -> Row:
    return {
        "number": attempt.number,
        "worker": attempt.worker,
        "status": attempt.status,
        "error_class": attempt.error_class,
        "error": redact_text(attempt.error, secrets),
        "status_code": attempt.status_code,
        "prompt_tokens": attempt.usage.prompt_tokens,
        "completion_tokens": attempt.usage.completion_tokens,
        "cached_tokens": attempt.usage.cached_tokens,
        "reasoning_tokens": attempt.usage.reasoning_tokens,
        "cost_usd": attempt.cost_usd,
        "latency_ms": attempt.latency_ms,
        "quota_wait_ms": attempt.quota_wait_ms,
        "started_at": _aware(attempt.started_at),
    }


def _executed_plan(planner_calls: list[Row]) -> list[Row]:
    """Each round's plan with worker names resolved, in the order the steps ran."""
    steps = []
    for call in planner_calls:
        pool = call.get("pool", [])
        for step in call["plan"]["steps"]:
            model_id = step["model_id"]
            worker = pool[model_id]["name"] if 0 <= model_id < len(pool) else None
            steps.append(
                {
                    "round": call["round"],
                    "model_id": model_id,
                    "worker": worker,
                    "subtask": step["subtask"],
                    "access_list": step["access_list"],
                }
            )
    return steps


StoredListener = Callable[[uuid.UUID, int, bool], None]


class TraceWrites:
    """Builds the trace writes a batch of workflow events calls for: rows are built now, the SQL
    runs later.

    The embedded TraceStore runs them in a thread; the distributed aggregator runs them inside
    the transaction that holds the workflow's row lock. ``pool`` gives the snapshot of the
    workers a workflow was offered (without secrets).

    ``sole_writer``: the caller holds the workflow's lock for every write and the workflow's
    row was written at its submission (the distributed aggregator). The row is then not made
    sure of, and the record's planner calls are written as they are rather than merged with
    the stored ones (read first, under a lock of their own): two statements fewer at a plan,
    three at the outcome. Its start may find the row marked running already, by the process
    that took the workflow to plan it (``runs.take_to_plan``), and records the pool there.
    """

    def __init__(
        self,
        dialect: str,
        pool: Pool,
        *,
        tenant: str = "default",
        secret_env_names: Iterable[str] = (),
        sole_writer: bool = False,
    ) -> None:
        if dialect not in {"sqlite", "postgresql"}:
            raise ValueError(f"unsupported database dialect {dialect!r}")
        self.workers = {w.name: w for w in pool.workers}
        self.tenant = tenant
        self.secret_env_names = tuple(secret_env_names)
        self.sole_writer = sole_writer
        self._sql = _Statements(dialect)

    def for_events(self, result: WorkflowRecord, events: Sequence[MachineEvent]) -> Write:
        """Every write the events call for (workflow, plans, steps, outcome), then the numbered
        events themselves, as one write; the workflow row is made sure of once, first."""
        secrets = secret_values(self.secret_env_names)
        started = [e for e in events if e.kind is EventKind.STARTED]
        # Scrubbed only on a start (scrubbing reads the environment for secrets).
        snapshot = (
            scrub_snapshot(
                [self.workers[name].snapshot() for e in started for name in e.workers or []]
            )
            if started
            else []
        )
        # A row created here (a store attached late) is created whole, snapshot included.
        workflow = _workflow_row(result, self.tenant, snapshot)
        # Steps finished in this delivery are written by their own event, not again by the
        # outcome's.
        finished_here = {e.step for e in events if e.kind is EventKind.STEP_FINISHED}
        writes = [
            self._for_event(result, event, workflow, secrets, finished_here) for event in events
        ]
        writes.append(self._events(result, list(events), secrets))
        # The start and the outcome create a missing workflow row: every workflow starts, and
        # the outcome records everything, so a store attached late still keeps a whole trace.
        ensure = not self.sole_writer and (bool(started) or any(e.kind.final for e in events))
        sql = self._sql

        def write(conn: Connection) -> None:
            if ensure:
                conn.execute(sql.ensure_workflow, workflow)
            for each in writes:
                each(conn)

        return write

    def _for_event(
        self,
        result: WorkflowRecord,
        event: MachineEvent,
        workflow: Row,
        secrets: list[str],
        finished_here: set[int | None],
    ) -> Write:
        workflow_id = workflow["id"]
        if event.kind is EventKind.STARTED:
            return self._started(workflow_id, workflow["pool_snapshot"])
        subject = event_subject(result, event)
        if event.kind is EventKind.ATTEMPTS and isinstance(subject, StepRecord):
            index = subject.index
            attempts = [_attempt_row(a, secrets) for a in subject.attempts]
            step_usage = _usage_values(_step_row(subject, secrets))
            totals = _usage_values(_final_workflow_values(result, secrets))
            return lambda conn: self._late_attempts(
                conn, workflow_id, index, attempts, step_usage, totals
            )
        if isinstance(subject, PlanOutcome):
            if self.sole_writer:  # the record holds every round's first call: the trace's
                every = [o.model_dump(mode="json") for o in result.planner_calls]
                return lambda conn: self._set_plans(conn, workflow_id, every)
            calls = [subject.model_dump(mode="json")]
            return lambda conn: self._merge_plans(conn, workflow_id, calls)
        if isinstance(subject, StepRecord):
            if event.kind is EventKind.STEP_STARTED:
                row = _step_row(subject, secrets, status=StepStatus.RUNNING)
                return lambda conn: self._start_step(conn, workflow_id, row)
            row = _step_row(subject, secrets)
            attempts = [_attempt_row(a, secrets) for a in subject.attempts]
            return lambda conn: self._finish_step(conn, workflow_id, row, attempts)
        return self._finished(result, secrets, finished_here)

    def started(self, result: WorkflowRecord, pool_snapshot: list[dict[str, Any]]) -> Write:
        """The workflow row with the pool it was offered (scrubbed of secrets), running."""
        workflow = _workflow_row(result, self.tenant, scrub_snapshot(pool_snapshot))
        ensure_workflow = self._sql.ensure_workflow
        mark_running = self._started(result.workflow_id, workflow["pool_snapshot"])

        def write(conn: Connection) -> None:
            conn.execute(ensure_workflow, workflow)
            mark_running(conn)

        return write

    def _started(self, workflow_id: uuid.UUID, pool_snapshot: list[dict[str, Any]]) -> Write:
        sql = self._sql
        mark = sql.mark_taken_running if self.sole_writer else sql.mark_running

        def write(conn: Connection) -> None:
            # A submitted workflow waited as "queued": it runs now.
            conn.execute(mark, {"workflow": workflow_id, "snapshot": pool_snapshot})

        return write

    def _events(
        self, result: WorkflowRecord, events: list[MachineEvent], secrets: list[str]
    ) -> Write:
        """The numbered events (plan, steps, outcome) clients stream; a replay adds nothing."""
        rows = []
        for event in events:
            if event.sequence:
                row = event_row(result, event)
                # Payloads carry steps' and attempts' errors, which may quote a key.
                row["payload"] = redact_strings(row["payload"], secrets)
                rows.append({"workflow_id": result.workflow_id, **row})
        insert_events = self._sql.insert_events

        def write(conn: Connection) -> None:
            if rows:
                conn.execute(insert_events, rows)

        return write

    def _finished(
        self, result: WorkflowRecord, secrets: list[str], skipped_steps: set[int | None]
    ) -> Write:
        """Also records plans and finished steps whose own events were missed (but not the
        ``skipped_steps``, written beside it)."""
        workflow_id = result.workflow_id
        final = _final_workflow_values(result, secrets)
        calls = [o.model_dump(mode="json") for o in result.planner_calls]
        steps = [
            (_step_row(s, secrets), [_attempt_row(a, secrets) for a in s.attempts])
            for s in result.steps
            if s.status.terminal and s.index not in skipped_steps
        ]
        finish_workflow = self._sql.finish_workflow
        # A sole writer wrote each plan at its own event, in the change that made it.
        merge_plans = not self.sole_writer

        def write(conn: Connection) -> None:
            if merge_plans:
                self._merge_plans(conn, workflow_id, calls)
            for row, attempts in steps:
                self._finish_step(conn, workflow_id, row, attempts)
            params = {"workflow": workflow_id, **_new(final)}
            ended = conn.execute(finish_workflow, params).first()
            if ended is not None:  # this write ended it (a repeat ends nothing): tell its client
                record_delivery(conn, result, result.finished_at or utcnow(), target=ended)

        return write

    # -- SQL --------------------------------------------------------------------------------

    def _merge_plans(self, conn: Connection, workflow_id: uuid.UUID, calls: list[Row]) -> None:
        """Keep one planner call per round (the first one recorded) and the plan they imply."""
        current: list[Row] = conn.execute(
            self._sql.planner_calls, {"workflow": workflow_id}
        ).scalar_one()
        by_round = {call["round"]: call for call in current}
        for call in calls:
            by_round.setdefault(call["round"], call)
        merged = [by_round[r] for r in sorted(by_round)]
        if merged != current:
            self._set_plans(conn, workflow_id, merged)

    def _set_plans(self, conn: Connection, workflow_id: uuid.UUID, calls: list[Row]) -> None:
        values = {
            "planner_calls": calls,
            "plan": _executed_plan(calls),
            "plan_valid": bool(calls) and calls[0]["round"] == 0 and calls[0]["valid"],
        }
        conn.execute(self._sql.set_plans, {"workflow": workflow_id, **_new(values)})

    def _start_step(self, conn: Connection, workflow_id: uuid.UUID, row: Row) -> None:
        conn.execute(self._sql.start_step, {"id": uuid.uuid4(), "workflow_id": workflow_id, **row})

    def _finish_step(
        self, conn: Connection, workflow_id: uuid.UUID, row: Row, attempts: list[Row]
    ) -> None:
        params = {"id": uuid.uuid4(), "workflow_id": workflow_id, **row}
        step_id = conn.execute(self._sql.finish_step, params).scalar_one_or_none()
        if step_id is None:  # already final: a duplicate delivery
            return
        if attempts:
            conn.execute(
                self._sql.insert_attempts,
                [{"id": uuid.uuid4(), "step_id": step_id, **a} for a in attempts],
            )

    def _late_attempts(
        self,
        conn: Connection,
        workflow_id: uuid.UUID,
        index: int,
        attempts: list[Row],
        step_usage: Row,
        totals: Row,
    ) -> None:
        """The calls of a step cancelled with its workflow, reported after the outcome: added
        to the step's (already final) row, its usage and the workflow's totals."""
        sql = self._sql
        step_id = conn.execute(
            sql.step_id, {"workflow": workflow_id, "index": index}
        ).scalar_one_or_none()
        if step_id is None or not attempts:
            return
        conn.execute(
            sql.insert_attempts, [{"id": uuid.uuid4(), "step_id": step_id, **a} for a in attempts]
        )
        conn.execute(sql.set_step_usage, {"step": step_id, **_new(step_usage)})
        conn.execute(sql.set_workflow_usage, {"workflow": workflow_id, **_new(totals)})


def _usage_values(row: Row) -> Row:
    return {name: row[name] for name in USAGE_COLUMNS}


def _new(values: Row) -> Row:
    """The parameters of ``_setting``'s SET clauses."""
    return {f"new_{name}": value for name, value in values.items()}


def _setting(columns: Iterable[str]) -> dict[str, BindParameter[Any]]:
    """SET clauses from parameters named after their columns; an UPDATE's parameter may not
    bear its column's name, hence the prefix."""
    return {name: bindparam(f"new_{name}") for name in columns}


class _Statements:
    """The trace's statements, built once per dialect: executed with each row's values as
    parameters, so SQLAlchemy compiles each one once instead of rebuilding it per row.
    ``workflow`` is the workflow id parameter of every update."""

    def __init__(self, dialect: str) -> None:
        this_workflow = workflow_table.c.id == bindparam("workflow")
        running = {"status": WorkflowStatus.RUNNING.value, "pool_snapshot": bindparam("snapshot")}
        self.mark_running = (
            update(workflow_table)
            .where(this_workflow, workflow_table.c.status == WorkflowStatus.QUEUED.value)
            .values(running)
        )
        # A sole writer's start is written once, and finds its row marked running already by
        # the aggregator that took it to plan its first round (``runs.take_to_plan``).
        self.mark_taken_running = (
            update(workflow_table)
            .where(
                this_workflow,
                workflow_table.c.status.in_(
                    [WorkflowStatus.QUEUED.value, WorkflowStatus.RUNNING.value]
                ),
            )
            .values(running)
        )
        self.planner_calls = (
            select(workflow_table.c.planner_calls).where(this_workflow).with_for_update()
        )
        self.set_plans = (
            update(workflow_table)
            .where(this_workflow)
            .values(_setting(["planner_calls", "plan", "plan_valid"]))
        )
        self.finish_workflow = (
            update(workflow_table)
            .where(this_workflow)
            .where(workflow_table.c.status.not_in([s.value for s in TERMINAL_WORKFLOW_STATUSES]))
            .values(_setting(FINAL_WORKFLOW_COLUMNS))
            .returning(*DELIVERY_TARGET)
        )
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        self.ensure_workflow = insert(workflow_table).on_conflict_do_nothing(index_elements=["id"])
        self.insert_events = insert(event_table).on_conflict_do_nothing(
            index_elements=["workflow_id", "sequence"]
        )
        self.start_step = insert(step_table).on_conflict_do_nothing(
            index_elements=["workflow_id", "index"]
        )
        step = insert(step_table)
        overwritten = [
            c.name for c in step_table.columns if c.name not in {"id", "workflow_id", "index"}
        ]
        self.finish_step = step.on_conflict_do_update(
            index_elements=["workflow_id", "index"],
            set_={name: step.excluded[name] for name in overwritten},
            where=step_table.c.status.not_in([s.value for s in TERMINAL_STEP_STATUSES]),
        ).returning(step_table.c.id)
        self.insert_attempts = insert(attempt_table).on_conflict_do_nothing(
            index_elements=["step_id", "number"]
        )
        self.step_id = select(step_table.c.id).where(
            step_table.c.workflow_id == bindparam("workflow"),
            step_table.c.index == bindparam("index"),
        )
        self.set_step_usage = (
            update(step_table)
            .where(step_table.c.id == bindparam("step"))
            .values(_setting(USAGE_COLUMNS))
        )
        self.set_workflow_usage = (
            update(workflow_table).where(this_workflow).values(_setting(USAGE_COLUMNS))
        )


class TraceStore:
    """Persists workflows as traces: the embedded runtime's observer of every workflow.

    Writes go through a group commit: a workflow's progress (its plans and steps) is written
    behind, so the workflow does not wait for a commit between its steps, while its outcome is
    committed before ``observe`` returns, so the executor finishes a workflow only once its
    answer is durable. ``on_stored`` callbacks hear, in order, of each delivery once it is
    committed: ``(workflow id, last event sequence, final)``.

    ``tenant`` is written on every workflow this store creates (a WorkflowRecord has no tenant).
    The engine belongs to the caller, who disposes of it.
    """

    def __init__(
        self,
        engine: Engine,
        pool: Pool,
        *,
        tenant: str = "default",
        secret_env_names: Iterable[str] = (),
    ) -> None:
        """``secret_env_names``: variables whose values are blanked wherever they appear (the
        pool's key variables), besides every secret-looking variable."""
        self.engine = engine
        self.writes = TraceWrites(
            engine.dialect.name, pool, tenant=tenant, secret_env_names=secret_env_names
        )
        self.commits = GroupCommit(engine)
        self.on_stored: list[StoredListener] = []

    async def observe(self, workflow: WorkflowRecord, events: Sequence[MachineEvent]) -> None:
        """Queue the delivery's writes; wait for their commit only when the workflow ended.
        Rows are built here, on the event loop (the executor keeps changing the records of
        parallel steps)."""
        if not events:
            return
        final = any(event.kind.final for event in events)
        # Kept: a delivery that finds the database full or away is committed once it is back,
        # so a workflow that ended meanwhile does not stay "running" in its trace.
        write = self.writes.for_events(workflow, events)
        stored = self.commits.submit(write, urgent=final, keep=True)
        last = max(event.sequence for event in events)
        workflow_id = workflow.workflow_id
        stored.add_done_callback(lambda done: self._announce(done, workflow_id, last, final))
        if final:
            await asyncio.shield(stored)

    def record(self, write: Write) -> asyncio.Future[bool]:
        """Queue ``write`` for the next group commit, ahead of every write queued after it; the
        future says whether it was committed."""
        return self.commits.submit(write)

    async def flush(self) -> None:
        """Wait until every write queued so far is committed (or has failed)."""
        await self.commits.flush()

    def _announce(
        self, done: asyncio.Future[bool], workflow_id: uuid.UUID, last: int, final: bool
    ) -> None:
        if done.cancelled() or not done.result():
            return  # nothing new is stored: readers would find nothing
        for listener in self.on_stored:
            listener(workflow_id, last, final)

    # -- reads ------------------------------------------------------------------------------

    async def get_workflow(
        self, workflow_id: uuid.UUID, *, tenant: str | None = None
    ) -> WorkflowRow | None:
        """The workflow, or None; with ``tenant`` also None when it belongs to another tenant."""

        def read() -> WorkflowRow | None:
            with Session(self.engine) as session:
                row = session.get(WorkflowRow, workflow_id)
            return None if row is None or (tenant and row.tenant != tenant) else row

        return await asyncio.to_thread(read)

    async def list_steps(self, workflow_id: uuid.UUID) -> list[StepRow]:
        def read() -> list[StepRow]:
            with Session(self.engine) as session:
                query = select(StepRow).where(col(StepRow.workflow_id) == workflow_id)
                return list(session.exec(query.order_by(col(StepRow.index))).all())

        return await asyncio.to_thread(read)

    async def list_attempts(self, step_id: uuid.UUID) -> list[AttemptRow]:
        def read() -> list[AttemptRow]:
            with Session(self.engine) as session:
                query = select(AttemptRow).where(col(AttemptRow.step_id) == step_id)
                return list(session.exec(query.order_by(col(AttemptRow.number))).all())

        return await asyncio.to_thread(read)
