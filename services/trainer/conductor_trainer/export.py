"""Traces as training data: one JSON line per workflow, what the Conductor saw and wrote.

Each row carries the Conductor prompt (re-rendered from the question and the pool it was shown,
in the paper's three-lists form a trained checkpoint writes), its raw output and the same plan
as canonical lists, the reward when one is known (the client's feedback, 0..1), and the
reference answer when the workflow was labelled with one (label ``reference``), and what ran:
each executed step's worker, status and cost, who answered it (a fallback may have), and the
workflow's total cost (what ``conductor router train --traces`` learns from).

``suite_row`` turns a labelled workflow into a suite item (question, reference, kind) that
``conductor train --suite F.jsonl`` trains on with live rollouts: the method's reward needs the
plan executed and verified, which a recorded output with client feedback cannot give.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from conductor.ports import PlanFormat, PlanRequest
from conductor.protocol import render_prompt
from conductor.variants import MAX_STEPS_LIMIT, Variant
from conductor.workflow import PlanOutcome
from conductor_adapters.store.models import AttemptRow, StepRow, WorkflowRow
from conductor_evaluation import AnswerKind, Domain

# Kinds checked from a single reference string (choice needs choices, code needs tests).
SUITE_KINDS = (AnswerKind.MATH.value, AnswerKind.EXACT.value)
BATCH = 500  # rows fetched at a time: exports of millions of workflows stay in bounded memory


def export_rows(
    engine: Engine,
    variants: dict[str, Variant],
    *,
    tenant: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Finished workflows, oldest first, as training rows."""
    query = select(WorkflowRow).where(col(WorkflowRow.status) != "running")
    if tenant is not None:
        query = query.where(WorkflowRow.tenant == tenant)
    if since is not None:
        query = query.where(col(WorkflowRow.created_at) >= since)
    query = query.order_by(col(WorkflowRow.created_at), col(WorkflowRow.id)).limit(limit)
    with Session(engine) as session:
        for batch in session.exec(query.execution_options(yield_per=BATCH)).partitions(BATCH):
            steps = executed_steps(session, [row.id for row in batch])
            for row in batch:
                exported = training_row(row, variants, steps.get(row.id, []))
                if exported is not None:
                    yield exported


def executed_steps(
    session: Session, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """The executed steps of these workflows, in order, each with the worker that answered it
    (the step's own or one of its fallbacks; None when no call succeeded): two queries a batch."""
    rows = session.exec(
        select(StepRow)
        .where(col(StepRow.workflow_id).in_(ids))
        .order_by(col(StepRow.workflow_id), col(StepRow.index))
    ).all()
    answered = dict(
        session.exec(
            select(AttemptRow.step_id, AttemptRow.worker).where(
                col(AttemptRow.step_id).in_([step.id for step in rows]),
                AttemptRow.status == "ok",
            )
        ).all()
    )
    steps: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for step in rows:
        steps.setdefault(step.workflow_id, []).append(
            {
                "index": step.index,
                "round": step.round,
                "kind": step.kind,
                "worker": step.worker,
                "answered_by": answered.get(step.id),
                "status": step.status,
                "cost_usd": step.cost_usd,
            }
        )
    return steps


def training_row(
    row: WorkflowRow, variants: dict[str, Variant], steps: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """None for a workflow the Conductor never planned (it failed before its first plan)."""
    if not row.planner_calls:
        return None
    first = PlanOutcome.model_validate(row.planner_calls[0])
    variant = variants.get(row.variant)
    max_steps = variant.max_steps if variant is not None else MAX_STEPS_LIMIT
    request = PlanRequest(question=row.question, pool=first.pool, max_steps=max_steps)
    prompt = [m.as_text_turn() for m in render_prompt(request, PlanFormat.LISTS)]
    planned = {
        "pool": [entry.name for entry in first.pool],
        "prompt": prompt,
        "output": first.raw_output,
        "output_lists": first.plan.as_lists_text() if first.valid else None,
        "plan_valid": first.valid,
    }
    return _exported(row, planned, steps)


def unplanned_row(row: WorkflowRow, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A workflow the Conductor never planned, in training_row's fields (which skips it) with
    no prompt or output: what an export of everything (the trace prune's) writes for it."""
    unplanned: dict[str, Any] = {
        "pool": [],
        "prompt": None,
        "output": None,
        "output_lists": None,
        "plan_valid": False,
    }
    return _exported(row, unplanned, steps)


def _exported(
    row: WorkflowRow, planned: dict[str, Any], steps: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "workflow_id": str(row.id),
        "tenant": row.tenant,
        "created_at": row.created_at.isoformat(),
        "variant": row.variant,
        "question": row.question,
        **planned,
        "status": row.status,
        "answer": row.answer,
        "reward": row.feedback,
        "feedback": row.feedback,
        "reference": row.labels.get("reference"),
        "labels": row.labels,
        "steps": steps,
        "cost_usd": row.cost_usd,
    }


def suite_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """An exported row as a suite item: the ``reference`` label is the answer, the ``kind``
    label (math or exact; default exact) says how it is checked, ``domain`` is kept when
    valid. None for a workflow without a usable reference."""
    labels: dict[str, str] = row["labels"] or {}
    reference = row["reference"]
    kind = labels.get("kind", AnswerKind.EXACT.value)
    if not isinstance(reference, str) or not reference.strip() or kind not in SUITE_KINDS:
        return None
    item = {"id": row["workflow_id"], "question": row["question"], "answer": reference}
    item["kind"] = kind
    if labels.get("domain") in {d.value for d in Domain}:
        item["domain"] = labels["domain"]
    return item
