"""What clients read back: a workflow, its events, and the feedback they give.

Reads go to the trace tables, which both runtimes write as a workflow runs, so the embedded
and the distributed API answer alike. Every read is scoped to the caller's tenant: another
tenant's workflow is reported missing, never forbidden, so its existence does not leak.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, select, update

from conductor.machine import FINAL_EVENT_KINDS
from conductor.workflow import AttemptRecord, PlanOutcome
from conductor_adapters.store.models import (
    AttemptRow,
    StepRow,
    WorkflowRow,
    attempt_table,
    event_table,
    step_table,
    workflow_table,
)
from conductor_api.schemas import EventView, StepView, UsageView, WorkflowView

MAX_SEQUENCE = 2**31 - 1  # event sequences are 32-bit integers in the database


def _owned(conn: Any, workflow_id: uuid.UUID, tenant: str) -> bool:
    query = select(workflow_table.c.id).where(
        workflow_table.c.id == workflow_id, workflow_table.c.tenant == tenant
    )
    return conn.execute(query).first() is not None


def load_workflow(engine: Engine, workflow_id: uuid.UUID, tenant: str) -> WorkflowView | None:
    with engine.connect() as conn:
        query = select(workflow_table).where(
            workflow_table.c.id == workflow_id, workflow_table.c.tenant == tenant
        )
        row = conn.execute(query).mappings().one_or_none()
        if row is None:
            return None
        workflow = WorkflowRow.model_validate(dict(row))
        steps = [
            StepRow.model_validate(dict(r))
            for r in conn.execute(
                select(step_table)
                .where(step_table.c.workflow_id == workflow_id)
                .order_by(step_table.c.index)
            ).mappings()
        ]
        attempts: dict[uuid.UUID, list[AttemptRow]] = {}
        if steps:
            query = (
                select(attempt_table)
                .where(attempt_table.c.step_id.in_([s.id for s in steps]))
                .order_by(attempt_table.c.number)
            )
            for r in conn.execute(query).mappings():
                attempt = AttemptRow.model_validate(dict(r))
                attempts.setdefault(attempt.step_id, []).append(attempt)
    return _view(workflow, steps, attempts)


def _view(
    workflow: WorkflowRow, steps: list[StepRow], attempts: dict[uuid.UUID, list[AttemptRow]]
) -> WorkflowView:
    return WorkflowView(
        id=workflow.id,
        status=workflow.status,
        variant=workflow.variant,
        question=workflow.question,
        metadata=workflow.labels,
        plan_valid=workflow.plan_valid,
        planner_calls=[PlanOutcome.model_validate(c) for c in workflow.planner_calls],
        steps=[_step_view(s, attempts.get(s.id, [])) for s in steps],
        answer=workflow.answer,
        error=workflow.error,
        usage=UsageView(**_usage(workflow), total_tokens=workflow.total_tokens),
        cost_usd=workflow.cost_usd,
        latency_ms=workflow.latency_ms,
        feedback=workflow.feedback,
        created_at=workflow.created_at,
        finished_at=workflow.finished_at,
    )


def _usage(row: WorkflowRow | StepRow | AttemptRow) -> dict[str, int]:
    return {
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cached_tokens": row.cached_tokens,
        "reasoning_tokens": row.reasoning_tokens,
    }


def _step_view(step: StepRow, attempts: list[AttemptRow]) -> StepView:
    data = step.model_dump(exclude={"id", "workflow_id", "total_tokens", *_usage(step)})
    return StepView(
        **data,
        usage=_usage(step),
        attempts=[
            AttemptRecord(
                **a.model_dump(exclude={"id", "step_id", *_usage(a)}),
                usage=_usage(a),
            )
            for a in attempts
        ],
    )


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
                data=r["payload"],
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


def store_feedback(engine: Engine, workflow_id: uuid.UUID, tenant: str, score: float) -> bool:
    """Keep a client's score of the workflow (the reward training reads); the latest counts."""
    with engine.begin() as conn:
        done = conn.execute(
            update(workflow_table)
            .where(workflow_table.c.id == workflow_id, workflow_table.c.tenant == tenant)
            .values(feedback=score)
        )
    return bool(done.rowcount)
