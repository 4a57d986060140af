"""What clients read back: a workflow, its events, and the feedback they give.

Reads go to the trace tables, which both runtimes write as a workflow runs, so the embedded
and the distributed API answer alike. Every read is scoped to the caller's tenant: another
tenant's workflow is reported missing, never forbidden, so its existence does not leak.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, RowMapping, and_, bindparam, exists, func, or_, select, update

from conductor.machine import FINAL_EVENT_KINDS
from conductor.workflow import TERMINAL_WORKFLOW_STATUSES, AttemptRecord, answer_tool_calls
from conductor_adapters.store.models import (
    attempt_table,
    event_table,
    run_table,
    step_table,
    workflow_table,
)
from conductor_adapters.store.redact import without_addresses
from conductor_api.schemas import (
    EventView,
    StepView,
    UsageView,
    WorkflowSummary,
    WorkflowView,
)

MAX_SEQUENCE = 2**31 - 1  # event sequences are 32-bit integers in the database


def _owned(conn: Any, workflow_id: uuid.UUID, tenant: str) -> bool:
    query = select(workflow_table.c.id).where(
        workflow_table.c.id == workflow_id, workflow_table.c.tenant == tenant
    )
    return conn.execute(query).first() is not None


# Built once: executed with parameters, each is compiled once.
_WORKFLOW = select(workflow_table).where(
    workflow_table.c.id == bindparam("workflow"), workflow_table.c.tenant == bindparam("tenant")
)
_STEPS = (
    select(step_table)
    .where(step_table.c.workflow_id == bindparam("workflow"))
    .order_by(step_table.c.index)
)
_ATTEMPTS = (
    select(attempt_table)
    .where(attempt_table.c.step_id.in_(bindparam("steps", expanding=True)))
    .order_by(attempt_table.c.number)
)


def load_workflow(engine: Engine, workflow_id: uuid.UUID, tenant: str) -> WorkflowView | None:
    with engine.connect() as conn:
        workflow = (
            conn.execute(_WORKFLOW, {"workflow": workflow_id, "tenant": tenant})
            .mappings()
            .one_or_none()
        )
        if workflow is None:
            return None
        steps = list(conn.execute(_STEPS, {"workflow": workflow_id}).mappings())
        attempts: dict[uuid.UUID, list[RowMapping]] = {}
        if steps:
            found = conn.execute(_ATTEMPTS, {"steps": [s["id"] for s in steps]}).mappings()
            for attempt in found:
                attempts.setdefault(attempt["step_id"], []).append(attempt)
    return _view(workflow, steps, attempts)


def _view(
    workflow: RowMapping, steps: list[RowMapping], attempts: dict[uuid.UUID, list[RowMapping]]
) -> WorkflowView:
    """The view of the rows as read (the view's own validation checks them)."""
    step_views = [_step_view(s, attempts.get(s["id"], [])) for s in steps]
    return WorkflowView(
        id=workflow["id"],
        status=workflow["status"],
        variant=workflow["variant"],
        question=workflow["question"],
        metadata=workflow["labels"],
        plan_valid=workflow["plan_valid"],
        planner_calls=workflow["planner_calls"],
        steps=step_views,
        answer=workflow["answer"],
        tool_calls=answer_tool_calls(workflow["status"], list(step_views)),
        error=_hidden(workflow["error"]),
        usage=UsageView(**_usage(workflow), total_tokens=workflow["total_tokens"]),
        cost_usd=workflow["cost_usd"],
        latency_ms=workflow["latency_ms"],
        feedback=workflow["feedback"],
        created_at=workflow["created_at"],
        finished_at=workflow["finished_at"],
    )


_USAGE = ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")


def _usage(row: RowMapping) -> dict[str, int]:
    return {name: row[name] for name in _USAGE}


def _fields(row: RowMapping, excluded: set[str]) -> dict[str, Any]:
    return {name: value for name, value in row.items() if name not in excluded}


_NOT_IN_STEP_VIEW = {"id", "workflow_id", "total_tokens", *_USAGE}
_NOT_IN_ATTEMPT = {"id", "step_id", *_USAGE}


def _step_view(step: RowMapping, attempts: list[RowMapping]) -> StepView:
    fields = _fields(step, _NOT_IN_STEP_VIEW)
    fields["error"] = _hidden(fields.get("error"))
    return StepView(
        **fields,
        usage=_usage(step),
        attempts=[_attempt(a) for a in attempts],
    )


def _attempt(row: RowMapping) -> AttemptRecord:
    fields = _fields(row, _NOT_IN_ATTEMPT)
    fields["error"] = _hidden(fields.get("error"))
    return AttemptRecord(**fields, usage=_usage(row))


def _hidden(error: str | None) -> str | None:
    """An error as clients read it: provider endpoints and internal hosts replaced (the trace
    table keeps them, for operators)."""
    return None if error is None else without_addresses(error)


def _payload(data: Any) -> Any:
    """An event's payload with ``_hidden`` applied to every ``error`` in it."""
    if isinstance(data, dict):
        return {
            k: _hidden(v) if k == "error" and isinstance(v, str) else _payload(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_payload(v) for v in data]
    return data


EVENTS_PER_READ = 500


def load_events(
    engine: Engine, workflow_id: uuid.UUID, tenant: str, after: int, limit: int = EVENTS_PER_READ
) -> list[EventView] | None:
    """Events with a sequence above ``after``, in order; None when the workflow is not the
    tenant's (or does not exist)."""
    with engine.connect() as conn:
        if not _owned(conn, workflow_id, tenant):
            return None
        query = (
            select(event_table)
            .where(event_table.c.workflow_id == workflow_id, event_table.c.sequence > after)
            .order_by(event_table.c.sequence)
            .limit(limit)
        )
        return [
            EventView(
                workflow_id=r["workflow_id"],
                sequence=r["sequence"],
                kind=r["kind"],
                at=r["at"],
                data=_payload(r["payload"]),
            )
            for r in conn.execute(query).mappings()
        ]


def outcome_passed(engine: Engine, workflow_id: uuid.UUID, after: int) -> bool:
    """Whether the workflow's outcome (its last event) is at or before ``after``: a reader
    resuming there has nothing more to wait for. An outcome stored after the reader's last
    read has a greater sequence, so it is read next, not skipped."""
    query = select(event_table.c.sequence).where(
        event_table.c.workflow_id == workflow_id,
        event_table.c.kind.in_(FINAL_EVENT_KINDS),
        event_table.c.sequence <= after,
    )
    with engine.connect() as conn:
        return conn.execute(query.limit(1)).first() is not None


_OUTCOME_STORED = select(
    workflow_table.c.id,
    exists()
    .where(
        event_table.c.workflow_id == workflow_table.c.id,
        event_table.c.kind.in_(FINAL_EVENT_KINDS),
    )
    .label("finished"),
).where(
    workflow_table.c.id == bindparam("workflow"), workflow_table.c.tenant == bindparam("tenant")
)


def outcome_stored(engine: Engine, workflow_id: uuid.UUID, tenant: str) -> bool | None:
    """Whether the workflow's outcome is stored, in one query that reads no event; None when
    the workflow is not the tenant's (or does not exist)."""
    with engine.connect() as conn:
        row = conn.execute(_OUTCOME_STORED, {"workflow": workflow_id, "tenant": tenant}).first()
    return None if row is None else bool(row.finished)


@dataclass(frozen=True)
class Idempotent:
    """The workflow an Idempotency-Key made, and the hash of the request that made it."""

    workflow_id: uuid.UUID
    request_hash: str | None
    status: str


def find_idempotent(engine: Engine, tenant: str, key: str) -> Idempotent | None:
    table = workflow_table
    query = select(table.c.id, table.c.request_hash, table.c.status).where(
        table.c.tenant == tenant, table.c.idempotency_key == key
    )
    with engine.connect() as conn:
        row = conn.execute(query).first()
    return None if row is None else Idempotent(row.id, row.request_hash, row.status)


def as_utc(moment: datetime | None) -> datetime | None:
    """A time a client sent without a zone is taken as UTC, as the stored times are."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class WorkflowFilter:
    """What ``list_workflows`` keeps; None or empty keeps everything."""

    status: str | None = None
    variant: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_after: datetime | None = None
    created_before: datetime | None = None
    # Words that must all appear in the question, in any case.
    search: str | None = None


_SUMMARY_COLUMNS = [
    workflow_table.c[name]
    for name in (
        "id",
        "status",
        "variant",
        "question",
        "labels",
        "error",
        "cost_usd",
        "latency_ms",
        "created_at",
        "finished_at",
        "total_tokens",
        "plan",
        *_USAGE,
    )
]
QUESTION_PREVIEW_CHARS = 500
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100


def list_workflows(
    engine: Engine,
    tenant: str,
    wanted: WorkflowFilter,
    *,
    limit: int,
    after: uuid.UUID | None = None,
) -> tuple[list[WorkflowSummary], bool] | None:
    """The tenant's workflows that ``wanted`` keeps, newest first, ``limit`` at most, starting
    after the workflow ``after``; and whether more follow. None when ``after`` is not one of the
    tenant's workflows. One index range (tenant, created_at, id) per page."""
    table = workflow_table
    query = select(*_SUMMARY_COLUMNS).where(table.c.tenant == tenant)
    if wanted.status is not None:
        query = query.where(table.c.status == wanted.status)
    if wanted.variant is not None:
        query = query.where(table.c.variant == wanted.variant)
    for key, value in wanted.labels.items():
        query = query.where(table.c.labels[key].as_string() == value)
    if wanted.created_after is not None:
        query = query.where(table.c.created_at >= wanted.created_after)
    if wanted.created_before is not None:
        query = query.where(table.c.created_at < wanted.created_before)
    for word in (wanted.search or "").split():
        # contains(autoescape): a % or _ in the search is a character, not a wildcard.
        query = query.where(func.lower(table.c.question).contains(word.lower(), autoescape=True))
    with engine.connect() as conn:
        if after is not None:
            mark = conn.execute(
                select(table.c.created_at).where(table.c.id == after, table.c.tenant == tenant)
            ).scalar_one_or_none()
            if mark is None:
                return None
            query = query.where(
                or_(table.c.created_at < mark, and_(table.c.created_at == mark, table.c.id < after))
            )
        query = query.order_by(table.c.created_at.desc(), table.c.id.desc()).limit(limit + 1)
        rows = conn.execute(query).mappings().all()
    summaries = [_summary(row) for row in rows[:limit]]
    return summaries, len(rows) > limit


def _summary(row: RowMapping) -> WorkflowSummary:
    return WorkflowSummary(
        id=row["id"],
        status=row["status"],
        variant=row["variant"],
        question=row["question"][:QUESTION_PREVIEW_CHARS],
        metadata=row["labels"],
        error=_hidden(row["error"]),
        usage=UsageView(**_usage(row), total_tokens=row["total_tokens"]),
        cost_usd=row["cost_usd"],
        latency_ms=row["latency_ms"],
        step_count=len(row["plan"] or []),
        created_at=row["created_at"],
        finished_at=row["finished_at"],
    )


def workflow_status(engine: Engine, workflow_id: uuid.UUID, tenant: str) -> str | None:
    """The workflow's status as stored; None when it is not the tenant's (or does not exist)."""
    query = select(workflow_table.c.status).where(
        workflow_table.c.id == workflow_id, workflow_table.c.tenant == tenant
    )
    with engine.connect() as conn:
        status: str | None = conn.execute(query).scalar_one_or_none()
    return status


def run_streams_answer(engine: Engine, workflow_id: uuid.UUID) -> bool:
    """Whether a workflow the aggregators run asked that its answer stream and has not ended,
    as its run row says (the distributed runtime's; the trace row does not keep the ask)."""
    query = select(run_table.c.status, run_table.c.request).where(
        run_table.c.workflow_id == workflow_id
    )
    with engine.connect() as conn:
        row = conn.execute(query).one_or_none()
    if row is None or row.status in TERMINAL_WORKFLOW_STATUSES:
        return False
    return bool((row.request or {}).get("stream_answer"))


def store_feedback(engine: Engine, workflow_id: uuid.UUID, tenant: str, score: float) -> bool:
    """Keep a client's score of the workflow (the reward training reads); the latest counts."""
    with engine.begin() as conn:
        done = conn.execute(
            update(workflow_table)
            .where(workflow_table.c.id == workflow_id, workflow_table.c.tenant == tenant)
            .values(feedback=score)
        )
    return bool(done.rowcount)
