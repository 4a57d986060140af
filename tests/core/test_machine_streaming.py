"""Which step's answer streams to the client as its worker writes it: the step that writes a
round's answer, when the client streams and that text is the workflow's answer as written."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from conductor.answer_format import AnswerFormat
from conductor.chat import ToolSpec, ToolUse
from conductor.machine import (
    CONDUCTOR_ENTRY,
    Dispatch,
    PlanReady,
    RequestPlan,
    StepSucceeded,
    WorkflowMachine,
)
from conductor.ports import StepCallResult
from conductor.variants import BUILTIN_VARIANTS
from conductor.workflow import Plan, PlanOutcome, PlanStep, PoolEntry

ENTRIES = [PoolEntry(name="alpha", description="A."), PoolEntry(name="beta", description="B.")]
ULTRA = BUILTIN_VARIANTS["conductor-ultra"]
REVIEW = len(ENTRIES)  # the Conductor's model id when it is offered


def machine(**fields: Any) -> WorkflowMachine:
    return WorkflowMachine.start(
        workflow_id=uuid.UUID(int=7),
        question="What is 6 * 7?",
        variant=ULTRA,
        entries=list(ENTRIES),
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
        tool_workers=["alpha", "beta"],
        **fields,
    )


def sends(workflow: WorkflowMachine, *steps: tuple[int, list[Any]]) -> list[Dispatch]:
    """Every send of the round-0 plan's steps, each answered as it is sent."""
    [request] = workflow.advance()
    assert isinstance(request, RequestPlan)
    assert CONDUCTOR_ENTRY in request.request.pool
    plan = Plan(
        steps=[
            PlanStep(model_id=m, subtask=f"Step {i}.", access_list=a)
            for i, (m, a) in enumerate(steps)
        ]
    )
    outcome = PlanOutcome(raw_output="(plan)", valid=True, plan=plan, pool=request.request.pool)
    assert workflow.apply(PlanReady(0, outcome))
    sent: list[Dispatch] = []
    actions = workflow.advance()
    while actions:
        dispatches = [a for a in actions if isinstance(a, Dispatch)]
        if not dispatches:
            break
        sent += dispatches
        for d in dispatches:
            result = StepCallResult(text="answer", worker=d.worker, attempts=[])
            workflow.apply(StepSucceeded(d.step, result))
        actions = workflow.advance()
    return sent


def test_the_answering_step_streams_when_its_client_streams() -> None:
    first, last = sends(machine(stream_answer=True), (0, []), (1, [0]))

    assert not first.streams
    assert last.streams


def test_nothing_streams_when_the_client_does_not() -> None:
    assert not any(d.streams for d in sends(machine(), (0, []), (1, [0])))


@pytest.mark.parametrize(
    "fields",
    [
        {"answer_format": AnswerFormat(type="json_object")},
        {"tools": ToolUse(tools=(ToolSpec(name="f"),))},
    ],
    ids=["a-required-form", "tools"],
)
def test_an_answer_that_is_not_its_text_as_written_does_not_stream(fields: dict[str, Any]) -> None:
    assert not any(d.streams for d in sends(machine(stream_answer=True, **fields), (0, [])))


def test_a_round_the_conductor_reviews_does_not_stream_its_answer() -> None:
    sent = sends(machine(stream_answer=True), (0, []), (REVIEW, ["all"]))

    assert [d.streams for d in sent] == [False]
