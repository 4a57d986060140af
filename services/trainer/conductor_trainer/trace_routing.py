"""Routing observations from exported traces (``conductor traces export``).

A finished workflow says how one worker did on one question when it completed with exactly one
step, answered by that step's own worker (what conductor-mini runs), and its correctness is
known: the client's feedback (0..1, the share of right), else the ``reference`` label checked
against the answer by the evaluation's verifier for the ``kind`` label (math or exact). A
multi-step workflow does not say which single worker would have been right, so it is skipped,
as are workflows that failed, were answered by a fallback worker (the step's cost is then
partly another worker's), or carry neither feedback nor a checkable reference; each is counted.

The observations are partial labels: one worker per question, the others unknown (nan). Each
is an item of suite ``traces`` keyed by its workflow id, so the held-out split by item key
applies to it as to an evaluation's items.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conductor.errors import ConfigurationError, validation_problems
from conductor_evaluation import AnswerKind, EvalItem, verify
from conductor_trainer.export import suite_row
from conductor_trainer.routing_data import RoutingData

TRACES_SUITE = "traces"

# Why a row taught nothing, in the order they are checked (a row counts under the first).
NOT_COMPLETED = "not completed"
NOT_ONE_STEP = "not exactly one step (a multi-step or recursive workflow)"
NOT_ITS_WORKER = "not answered by its step's worker (a fallback answered, or none did)"
UNLABELLED = "neither feedback nor a reference label of kind math or exact"
DUPLICATE = "a workflow already read (the same workflow in two exports)"


class TraceStep(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: str
    worker: str
    answered_by: str | None
    cost_usd: float = Field(ge=0)


class TraceRow(BaseModel):
    """The fields of an exported row that routing reads."""

    model_config = ConfigDict(extra="ignore")

    workflow_id: str
    question: str
    pool: list[str]
    status: str
    answer: str | None
    feedback: float | None = Field(ge=0, le=1)
    reference: str | None
    labels: dict[str, str]
    steps: list[TraceStep]


# What every export row has had; a row without them is not an export of traces.
_EXPORT_FIELDS = ("workflow_id", "question", "pool", "status", "output")


@dataclass
class TraceSummary:
    """What the exports gave: observations per source, skipped rows per reason."""

    rows: int = 0
    sources: Counter[str] = field(default_factory=Counter)  # feedback, reference
    skipped: Counter[str] = field(default_factory=Counter)

    def describe(self) -> str:
        used = sum(self.sources.values())
        text = (
            f"{used} of {self.rows} traced workflows are routing observations "
            f"({self.sources['feedback']} by feedback, {self.sources['reference']} by reference)"
        )
        if self.skipped:
            reasons = "; ".join(f"{n} {reason}" for reason, n in self.skipped.most_common())
            text += f"; skipped: {reasons}"
        return text


@dataclass
class _Observation:
    row: TraceRow
    worker: str
    cost_usd: float
    right: float | None = None  # None until the reference is checked
    item: EvalItem | None = None


def trace_routing_data(paths: Sequence[Path]) -> tuple[RoutingData, TraceSummary]:
    """The observations of one or more trace exports, as routing data (nan where a worker did
    not run), and what was used and skipped. A file that is not an export, a malformed line or
    a step whose worker is not in its row's pool is an error naming the file and line."""
    summary = TraceSummary()
    found: list[_Observation] = []
    seen: set[str] = set()
    for path in paths:
        for line_number, row in _rows(path):
            summary.rows += 1
            if row.workflow_id in seen:
                summary.skipped[DUPLICATE] += 1
                continue
            seen.add(row.workflow_id)
            where = f"{path}: line {line_number}"
            observation, reason = _observation(row, where)
            if observation is None:
                summary.skipped[reason] += 1
            else:
                found.append(observation)
    asyncio.run(_check_references([o for o in found if o.right is None]))
    for observation in found:
        summary.sources["feedback" if observation.row.feedback is not None else "reference"] += 1
    return _as_routing_data(found), summary


def _rows(path: Path) -> list[tuple[int, TraceRow]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"trace export {path}: {exc}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"trace export {path}: line {number}"
        try:
            raw: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{where}: invalid JSON ({exc.msg})") from None
        rows.append((number, _row(raw, where)))
    return rows


def _row(raw: Any, where: str) -> TraceRow:
    if not isinstance(raw, dict) or any(key not in raw for key in _EXPORT_FIELDS):
        raise ConfigurationError(
            f"{where}: not a row of `conductor traces export` (one has "
            f"{', '.join(_EXPORT_FIELDS)}; an --as-suite file cannot be learnt from)"
        )
    if "steps" not in raw:
        raise ConfigurationError(
            f"{where}: the row has no steps (exported by an older version): export again"
        )
    try:
        return TraceRow.model_validate(raw)
    except ValidationError as exc:
        raise ConfigurationError(f"{where}: {validation_problems(exc)}") from None


def _observation(row: TraceRow, where: str) -> tuple[_Observation | None, str]:
    """The observation a row gives, or None and why not."""
    for step in row.steps:
        if step.kind == "worker" and step.worker not in row.pool:
            raise ConfigurationError(
                f"trace export {where}: step worker {step.worker!r} is not in the row's pool "
                f"({', '.join(row.pool)})"
            )
    if row.status != "completed":
        return None, NOT_COMPLETED
    if len(row.steps) != 1 or row.steps[0].kind != "worker":
        return None, NOT_ONE_STEP
    step = row.steps[0]
    if step.answered_by != step.worker:
        return None, NOT_ITS_WORKER
    observation = _Observation(row=row, worker=step.worker, cost_usd=step.cost_usd)
    if row.feedback is not None:
        observation.right = row.feedback
        return observation, ""
    suite_item = suite_row(row.model_dump())
    if suite_item is None:
        return None, UNLABELLED
    observation.item = EvalItem(suite=TRACES_SUITE, **suite_item)
    return observation, ""


async def _check_references(observations: list[_Observation]) -> None:
    """Each answer against its reference, by the evaluation's verifier (math in its checker
    processes, under their time limit)."""
    checked = [(o, o.item) for o in observations if o.item is not None]
    verdicts = await asyncio.gather(*(verify(item, o.row.answer) for o, item in checked))
    for (observation, _), verdict in zip(checked, verdicts, strict=True):
        observation.right = 1.0 if verdict.correct else 0.0


def _as_routing_data(found: list[_Observation]) -> RoutingData:
    workers = sorted({o.worker for o in found})
    right = np.full((len(found), len(workers)), np.nan)
    cost = np.full((len(found), len(workers)), np.nan)
    items = []
    for i, o in enumerate(found):
        j = workers.index(o.worker)
        right[i, j], cost[i, j] = o.right, o.cost_usd
        items.append(
            o.item
            or EvalItem(
                suite=TRACES_SUITE,
                id=o.row.workflow_id,
                question=o.row.question,
                answer=o.row.reference or "",
                kind=AnswerKind.EXACT,
            )
        )
    return RoutingData(items, workers, right, cost)
