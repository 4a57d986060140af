"""The trace store: a WorkflowObserver that writes each workflow, step and attempt to SQL.

Writes are idempotent so that redelivered events (Celery ``acks_late``, a resumed aggregator)
are harmless: rows are inserted with ON CONFLICT DO NOTHING, and a step or workflow that has
reached a terminal status is never written again (the first final write wins). Any event
creates the workflow row if it is missing, so a store attached late still keeps a trace.

Row values are built on the event loop before the SQL runs in a thread, because the executor
keeps mutating the records of parallel steps while a write is in flight.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from conductor.machine import EventKind, MachineEvent, event_row, event_subject
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
from conductor_adapters.store.models import (
    AttemptRow,
    StepRow,
    WorkflowRow,
    attempt_table,
    event_table,
    step_table,
    workflow_table,
)
from conductor_adapters.store.redact import (
    redact_strings,
    redact_text,
    scrub_snapshot,
    secret_values,
)

Row = dict[str, Any]


def _aware(value: datetime | None) -> datetime | None:
    """Naive datetimes are taken as UTC rather than losing the trace to a ValueError."""
    if value is None or value.utcoffset() is not None:
        return value
    return value.replace(tzinfo=UTC)


def _workflow_row(result: WorkflowRecord, tenant: str, snapshot: list[dict[str, Any]]) -> Row:
    return {
        "id": result.workflow_id,
        "tenant": tenant,
        "variant": result.variant,
        "question": result.question,
        "status": WorkflowStatus.RUNNING.value,
        "pool_snapshot": snapshot,
        "planner_calls": [],
        "plan": [],
        "plan_valid": False,
        "answer": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "total_tokens": 0,
        "cost_usd": 0.0,
        "latency_ms": 0.0,
        "feedback": None,
        "error": None,
        "created_at": _aware(result.created_at),
        "finished_at": None,
    }


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


Write = Callable[[Connection], None]


class TraceWrites:
    """Builds the trace writes a batch of workflow events calls for: rows are built now, the SQL
    runs later.

    The embedded TraceStore runs them in a thread; the distributed aggregator runs them inside
    the transaction that holds the workflow's row lock. ``pool`` gives the snapshot of the
    workers a workflow was offered (without secrets).
    """

    def __init__(
        self,
        dialect: str,
        pool: Pool,
        *,
        tenant: str = "default",
        secret_env_names: Iterable[str] = (),
    ) -> None:
        if dialect not in {"sqlite", "postgresql"}:
            raise ValueError(f"unsupported database dialect {dialect!r}")
        self.dialect = dialect
        self.workers = {w.name: w for w in pool.workers}
        self.tenant = tenant
        self.secret_env_names = tuple(secret_env_names)

    def for_events(self, result: WorkflowRecord, events: Sequence[MachineEvent]) -> Write:
        """Every write the events call for (workflow, plans, steps, outcome), then the numbered
        events themselves, as one write."""
        writes = [self._for_event(result, event) for event in events]
        writes.append(self.events(result, list(events)))

        def write(conn: Connection) -> None:
            for each in writes:
                each(conn)

        return write

    def _for_event(self, result: WorkflowRecord, event: MachineEvent) -> Write:
        if event.kind is EventKind.STARTED:
            snapshot = [self.workers[name].snapshot() for name in event.workers or []]
            return self.started(result, snapshot)
        subject = event_subject(result, event)
        if isinstance(subject, PlanOutcome):
            return self.plan(result, subject)
        if isinstance(subject, StepRecord):
            if event.kind is EventKind.STEP_STARTED:
                return self.step_started(result, subject)
            return self.step_finished(result, subject)
        return self.finished(result)

    def started(self, result: WorkflowRecord, pool_snapshot: list[dict[str, Any]]) -> Write:
        workflow = _workflow_row(result, self.tenant, scrub_snapshot(pool_snapshot))

        def write(conn: Connection) -> None:
            self._ensure_workflow(conn, workflow)
            # A submitted workflow waited as "queued": it runs now.
            conn.execute(
                update(workflow_table)
                .where(workflow_table.c.id == workflow["id"])
                .where(workflow_table.c.status == WorkflowStatus.QUEUED.value)
                .values(
                    status=WorkflowStatus.RUNNING.value, pool_snapshot=workflow["pool_snapshot"]
                )
            )

        return write

    def plan(self, result: WorkflowRecord, outcome: PlanOutcome) -> Write:
        workflow = _workflow_row(result, self.tenant, [])
        calls = [outcome.model_dump(mode="json")]
        return lambda conn: self._merge_plans(conn, workflow, calls)

    def step_started(self, result: WorkflowRecord, step: StepRecord) -> Write:
        workflow = _workflow_row(result, self.tenant, [])
        row = _step_row(step, secret_values(self.secret_env_names), status=StepStatus.RUNNING)
        return lambda conn: self._start_step(conn, workflow, row)

    def step_finished(self, result: WorkflowRecord, step: StepRecord) -> Write:
        workflow = _workflow_row(result, self.tenant, [])
        secrets = secret_values(self.secret_env_names)
        row = _step_row(step, secrets)
        attempts = [_attempt_row(a, secrets) for a in step.attempts]
        return lambda conn: self._finish_step(conn, workflow, row, attempts)

    def events(self, result: WorkflowRecord, events: list[MachineEvent]) -> Write:
        """The numbered events (plan, steps, outcome) clients stream; a replay adds nothing."""
        workflow = _workflow_row(result, self.tenant, [])
        secrets = secret_values(self.secret_env_names)
        rows = []
        for event in events:
            if event.sequence:
                row = event_row(result, event)
                # Payloads carry steps' and attempts' errors, which may quote a key.
                row["payload"] = redact_strings(row["payload"], secrets)
                rows.append({"workflow_id": workflow["id"], **row})

        def write(conn: Connection) -> None:
            self._ensure_workflow(conn, workflow)
            if rows:
                stmt = self._insert(event_table).values(rows)
                keys = ["workflow_id", "sequence"]
                conn.execute(stmt.on_conflict_do_nothing(index_elements=keys))

        return write

    def finished(self, result: WorkflowRecord) -> Write:
        """Also records plans and finished steps whose own events were missed."""
        workflow = _workflow_row(result, self.tenant, [])
        secrets = secret_values(self.secret_env_names)
        final = _final_workflow_values(result, secrets)
        calls = [o.model_dump(mode="json") for o in result.planner_calls]
        steps = [
            (_step_row(s, secrets), [_attempt_row(a, secrets) for a in s.attempts])
            for s in result.steps
            if s.status.terminal
        ]

        def write(conn: Connection) -> None:
            self._merge_plans(conn, workflow, calls)
            for row, attempts in steps:
                self._finish_step(conn, workflow, row, attempts)
            conn.execute(
                update(workflow_table)
                .where(workflow_table.c.id == workflow["id"])
                .where(
                    workflow_table.c.status.not_in([s.value for s in TERMINAL_WORKFLOW_STATUSES])
                )
                .values(final)
            )

        return write

    # -- SQL --------------------------------------------------------------------------------

    def _insert(self, table: Table) -> postgresql.Insert | sqlite.Insert:
        if self.dialect == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    def _ensure_workflow(self, conn: Connection, workflow: Row) -> None:
        stmt = self._insert(workflow_table).values(workflow)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["id"]))

    def _merge_plans(self, conn: Connection, workflow: Row, calls: list[Row]) -> None:
        """Keep one planner call per round (the first one recorded) and the plan they imply."""
        self._ensure_workflow(conn, workflow)
        table = workflow_table
        query = select(table.c.planner_calls).where(table.c.id == workflow["id"])
        current: list[Row] = conn.execute(query.with_for_update()).scalar_one()
        by_round = {call["round"]: call for call in current}
        for call in calls:
            by_round.setdefault(call["round"], call)
        merged = [by_round[r] for r in sorted(by_round)]
        if merged == current:
            return
        values = {
            "planner_calls": merged,
            "plan": _executed_plan(merged),
            "plan_valid": bool(merged) and merged[0]["round"] == 0 and merged[0]["valid"],
        }
        conn.execute(update(table).where(table.c.id == workflow["id"]).values(values))

    def _start_step(self, conn: Connection, workflow: Row, row: Row) -> None:
        self._ensure_workflow(conn, workflow)
        stmt = self._insert(step_table).values(id=uuid.uuid4(), workflow_id=workflow["id"], **row)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["workflow_id", "index"]))

    def _finish_step(self, conn: Connection, workflow: Row, row: Row, attempts: list[Row]) -> None:
        self._ensure_workflow(conn, workflow)
        stmt = self._insert(step_table).values(id=uuid.uuid4(), workflow_id=workflow["id"], **row)
        stmt = stmt.on_conflict_do_update(
            index_elements=["workflow_id", "index"],
            set_={name: stmt.excluded[name] for name in row if name != "index"},
            where=step_table.c.status.not_in([s.value for s in TERMINAL_STEP_STATUSES]),
        )
        step_id = conn.execute(stmt.returning(step_table.c.id)).scalar_one_or_none()
        if step_id is None:  # already final: a duplicate delivery
            return
        for attempt in attempts:
            insert = self._insert(attempt_table).values(id=uuid.uuid4(), step_id=step_id, **attempt)
            conn.execute(insert.on_conflict_do_nothing(index_elements=["step_id", "number"]))


class TraceStore:
    """Persists workflows as traces: the embedded runtime's observer of every workflow.

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
        self._engine = engine
        self.writes = TraceWrites(
            engine.dialect.name, pool, tenant=tenant, secret_env_names=secret_env_names
        )
        self._lock = asyncio.Lock()

    async def observe(self, workflow: WorkflowRecord, events: Sequence[MachineEvent]) -> None:
        """One transaction per delivery: its rows are built here, on the event loop, before the
        SQL runs in a thread (the executor keeps changing the records of parallel steps)."""
        await self._write(self.writes.for_events(workflow, events))

    # -- reads ------------------------------------------------------------------------------

    async def get_workflow(
        self, workflow_id: uuid.UUID, *, tenant: str | None = None
    ) -> WorkflowRow | None:
        """The workflow, or None; with ``tenant`` also None when it belongs to another tenant."""

        def read() -> WorkflowRow | None:
            with Session(self._engine) as session:
                row = session.get(WorkflowRow, workflow_id)
            return None if row is None or (tenant and row.tenant != tenant) else row

        return await asyncio.to_thread(read)

    async def list_steps(self, workflow_id: uuid.UUID) -> list[StepRow]:
        def read() -> list[StepRow]:
            with Session(self._engine) as session:
                query = select(StepRow).where(col(StepRow.workflow_id) == workflow_id)
                return list(session.exec(query.order_by(col(StepRow.index))).all())

        return await asyncio.to_thread(read)

    async def list_attempts(self, step_id: uuid.UUID) -> list[AttemptRow]:
        def read() -> list[AttemptRow]:
            with Session(self._engine) as session:
                query = select(AttemptRow).where(col(AttemptRow.step_id) == step_id)
                return list(session.exec(query.order_by(col(AttemptRow.number))).all())

        return await asyncio.to_thread(read)

    async def _write(self, fn: Write) -> None:
        def run() -> None:
            with self._engine.begin() as conn:
                fn(conn)

        async with self._lock:
            await asyncio.to_thread(run)
