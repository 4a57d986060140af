"""Tools on workflows, in the state machine: only the step that writes a round's answer is
offered the client's functions, on a worker whose wire format carries them; an answer that
asks for calls ends the workflow with them; a forced call must be made, with arguments that
follow its function's parameters."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from conductor.chat import ToolCall, ToolSpec, ToolUse
from conductor.machine import (
    CONDUCTOR_ENTRY,
    Action,
    Dispatch,
    PlanReady,
    RequestPlan,
    StepSucceeded,
    WorkflowMachine,
    WorkflowState,
)
from conductor.ports import StepCallResult
from conductor.variants import BUILTIN_VARIANTS, Variant
from conductor.workflow import (
    Plan,
    PlanOutcome,
    PlanStep,
    PoolEntry,
    StepKind,
    StepStatus,
    WorkflowStatus,
)

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
ENTRIES = [
    PoolEntry(name="local", description="A small model on llama.cpp: no tools."),
    PoolEntry(name="alpha", description="A generalist that calls functions."),
    PoolEntry(name="beta", description="A checker that calls functions."),
]
LOCAL, ALPHA, BETA = 0, 1, 2
TOOL_WORKERS = ["alpha", "beta"]
ULTRA = BUILTIN_VARIANTS["conductor-ultra"]
MINI = BUILTIN_VARIANTS["conductor-mini"]
WEATHER = ToolSpec(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
TOOLS = ToolUse(tools=(WEATHER,))


def start(
    variant: Variant = ULTRA, tools: ToolUse | None = TOOLS, entries: list[PoolEntry] = ENTRIES
) -> WorkflowMachine:
    return WorkflowMachine.start(
        workflow_id=uuid.UUID(int=1),
        question="What is the weather in Paris?",
        variant=variant,
        entries=list(entries),
        created_at=T0,
        tools=tools,
        tool_workers=TOOL_WORKERS,
    )


def plan(machine: WorkflowMachine, *steps: tuple[int, str, list[Any]]) -> list[Action]:
    [request] = machine.advance()
    assert isinstance(request, RequestPlan)
    outcome = PlanOutcome(
        raw_output="(plan)",
        valid=True,
        plan=Plan(steps=[PlanStep(model_id=m, subtask=t, access_list=a) for m, t, a in steps]),
        pool=request.request.pool,
    )
    assert machine.apply(PlanReady(request.round, outcome))
    return machine.advance()


def answer(
    machine: WorkflowMachine, index: int, text: str = "", calls: list[ToolCall] | None = None
) -> list[Action]:
    worker = machine.result.steps[index].worker
    call = StepCallResult(text=text, worker=worker, attempts=[], tool_calls=calls or [])
    assert machine.apply(StepSucceeded(index, call))
    return machine.advance()


def call(name: str = "get_weather", arguments: str = '{"city": "Paris"}') -> ToolCall:
    return ToolCall(id="call_1", name=name, arguments=arguments)


def only(actions: list[Action]) -> Dispatch:
    [action] = actions
    assert isinstance(action, Dispatch)
    return action


def test_only_the_answering_step_is_offered_the_tools() -> None:
    machine = start()
    first = only(plan(machine, (ALPHA, "Find facts.", []), (BETA, "Answer.", [0])))
    second = only(answer(machine, 0, "facts"))

    assert first.tools is None
    assert second.step == 1
    assert second.tools == TOOLS


def test_an_answering_step_planned_on_a_worker_without_tools_runs_on_the_first_that_has_them() -> (
    None
):
    machine = start()
    first = only(plan(machine, (LOCAL, "Draft.", []), (LOCAL, "Answer.", [0])))
    second = only(answer(machine, 0, "draft"))

    # The draft stays on the local worker; the answer moves to alpha, the plan keeps its choice
    assert first.worker == "local"
    assert first.tools is None
    assert second.worker == "alpha"
    assert second.tools == TOOLS
    assert machine.result.planner_calls[0].plan.steps[1].model_id == LOCAL


def test_a_one_step_variant_offered_tools_plans_over_the_tool_workers_only() -> None:
    machine = start(MINI)
    [request] = machine.advance()

    assert isinstance(request, RequestPlan)
    assert [e.name for e in request.request.pool] == TOOL_WORKERS


def test_without_tools_every_worker_is_planned_over_and_no_step_is_offered_any() -> None:
    machine = start(MINI, tools=None)
    [request] = machine.advance()
    assert isinstance(request, RequestPlan)
    assert [e.name for e in request.request.pool] == ["local", *TOOL_WORKERS]


def test_a_pool_with_no_worker_that_takes_tools_fails_at_once() -> None:
    machine = start(entries=ENTRIES[:1])

    assert machine.result.status is WorkflowStatus.FAILED
    assert "no worker of this workflow's pool takes tools" in (machine.result.error or "")


def test_an_answer_that_calls_a_function_completes_the_workflow_with_the_call() -> None:
    machine = start()
    plan(machine, (ALPHA, "Answer.", []))
    assert answer(machine, 0, "", [call()]) == []

    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.tool_calls == [call()]
    assert machine.result.steps[0].tool_calls == [call()]
    assert machine.result.answer == ""


def test_a_call_ends_the_workflow_before_its_review_round() -> None:
    machine = start()
    [request] = machine.advance()
    assert isinstance(request, RequestPlan)
    assert request.request.pool[-1] == CONDUCTOR_ENTRY
    machine = start()
    [dispatch] = plan(machine, (ALPHA, "Answer.", []), (len(ENTRIES), "Review.", []))
    assert machine.result.steps[-1].kind is StepKind.CONDUCTOR

    assert answer(machine, dispatch.step, "", [call()]) == []
    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.steps[-1].status is StepStatus.CANCELLED
    assert machine.result.tool_calls == [call()]


def test_a_text_answer_has_no_calls() -> None:
    machine = start()
    plan(machine, (ALPHA, "Answer.", []))
    answer(machine, 0, "18 C and sunny")

    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.answer == "18 C and sunny"
    assert machine.result.tool_calls == []


@pytest.mark.parametrize("choice", ["get_weather", "required"])
def test_a_forced_call_answered_in_text_fails_the_workflow(choice: str) -> None:
    machine = start(tools=ToolUse(tools=(WEATHER,), choice=choice))
    plan(machine, (ALPHA, "Answer.", []))
    answer(machine, 0, "It is sunny.")

    assert machine.result.status is WorkflowStatus.FAILED
    assert "called no function" in (machine.result.error or "")


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ('{"town": "Paris"}', "'city' is a required property"),
        ("Paris", "is not JSON"),
        ('{"city": 7}', "7 is not of type 'string'"),
    ],
)
def test_a_forced_calls_arguments_must_follow_its_parameters(arguments: str, reason: str) -> None:
    machine = start(tools=ToolUse(tools=(WEATHER,), choice="get_weather"))
    plan(machine, (ALPHA, "Answer.", []))
    answer(machine, 0, "", [call(arguments=arguments)])

    assert machine.result.status is WorkflowStatus.FAILED
    assert reason in (machine.result.error or "")


def test_a_forced_call_that_follows_its_parameters_completes() -> None:
    machine = start(tools=ToolUse(tools=(WEATHER,), choice="get_weather"))
    plan(machine, (ALPHA, "Answer.", []))
    answer(machine, 0, "", [call()])

    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.tool_calls == [call()]


def test_a_stored_state_keeps_the_tools_and_a_state_stored_before_them_has_none() -> None:
    machine = start()
    stored = machine.state.model_dump(mode="json")

    assert WorkflowState.model_validate(stored).tools == TOOLS
    del stored["tools"], stored["tool_workers"]
    assert WorkflowState.model_validate(stored).tools is None
