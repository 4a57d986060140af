"""The workflow state machine both runtimes drive: facts in, actions and events out, no I/O."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import conductor.machine as machine_module
from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Usage
from conductor.machine import (
    CONDUCTOR_ENTRY,
    Aborted,
    Action,
    Cancelled,
    DeadlinesPassed,
    Dispatch,
    EventKind,
    Fact,
    MessagesLost,
    PlanFailed,
    PlanReady,
    RequestPlan,
    StepFailed,
    StepSucceeded,
    WorkflowMachine,
    WorkflowState,
)
from conductor.ports import PlanRequest, PriorRound, StepCallResult
from conductor.variants import BUILTIN_VARIANTS, Variant
from conductor.workflow import (
    ALL,
    AccessEntry,
    AttemptRecord,
    Plan,
    PlanOutcome,
    PlanStep,
    PoolEntry,
    StepKind,
    StepStatus,
    WorkflowStatus,
)

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
WORKFLOW_ID = uuid.UUID("00000000-0000-0000-0000-000000000001")
QUESTION = "Which river runs through Paris?"
ENTRIES = [
    PoolEntry(name="alpha", description="A generalist."),
    PoolEntry(name="beta", description="A careful checker."),
]
NAMES = [e.name for e in ENTRIES]
WITH_CONDUCTOR = [*ENTRIES, CONDUCTOR_ENTRY]
ALPHA, BETA, CONDUCTOR = 0, 1, 2  # model ids in a pool that offers the Conductor
MINI = BUILTIN_VARIANTS["conductor-mini"]
ULTRA = BUILTIN_VARIANTS["conductor-ultra"]


def variant(**changes: Any) -> Variant:
    """Parallel, one recursion round, a 60 s step deadline and a 600 s workflow deadline."""
    fields: dict[str, Any] = {
        "name": "test",
        "max_steps": 5,
        "recursion_rounds": 1,
        "parallel": True,
        "step_timeout_s": 60,
        "workflow_timeout_s": 600,
    }
    return Variant(**{**fields, **changes})


TIMED = variant()


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Clock:
    """The machine's clock (send times, step times), set by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def set(self, seconds: float) -> None:
        self.now = at(seconds)


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(machine_module, "utcnow", clock)
    return clock


def start(workflow_variant: Variant = ULTRA, entries: list[PoolEntry] = ENTRIES) -> WorkflowMachine:
    return WorkflowMachine.start(
        workflow_id=WORKFLOW_ID,
        question=QUESTION,
        variant=workflow_variant,
        entries=list(entries),
        created_at=T0,
    )


def step(model_id: int, subtask: str, *access: AccessEntry) -> PlanStep:
    return PlanStep(model_id=model_id, subtask=subtask, access_list=access)


def outcome(
    pool: list[PoolEntry],
    *steps: PlanStep,
    stop: bool = False,
    usage: Usage | None = None,
    cost: float = 0.0,
) -> PlanOutcome:
    return PlanOutcome(
        raw_output="(the Conductor's text)",
        valid=True,
        plan=Plan(steps=steps),
        stop=stop,
        pool=pool,
        usage=usage or Usage(),
        cost_usd=cost,
    )


def answer(text: str, usage: Usage | None = None, cost: float = 0.0) -> StepCallResult:
    return StepCallResult(
        text=text, worker="alpha", usage=usage or Usage(), cost_usd=cost, attempts=[]
    )


def requested(actions: list[Action]) -> RequestPlan:
    [action] = actions
    assert isinstance(action, RequestPlan)
    return action


def dispatched(actions: list[Action]) -> list[int]:
    assert all(isinstance(a, Dispatch) for a in actions)
    return [a.step for a in actions if isinstance(a, Dispatch)]


def planned(
    workflow_variant: Variant, *steps: PlanStep, usage: Usage | None = None, cost: float = 0.0
) -> tuple[WorkflowMachine, list[Action]]:
    """A workflow whose round-0 plan was applied, and what the next ``advance()`` issued."""
    machine = start(workflow_variant)
    request = requested(machine.advance()).request
    assert machine.apply(PlanReady(0, outcome(request.pool, *steps, usage=usage, cost=cost)))
    return machine, machine.advance()


def succeed(
    machine: WorkflowMachine, index: int, text: str, usage: Usage | None = None, cost: float = 0.0
) -> list[Action]:
    """The step answers; returns what ``advance()`` then issued."""
    assert machine.apply(StepSucceeded(index, answer(text, usage, cost)))
    return machine.advance()


def awaiting_round_1() -> WorkflowMachine:
    """Round 0 ("draft", "check" seeing it, the Conductor) ran; round 1's plan is requested."""
    machine, _ = planned(
        ULTRA, step(ALPHA, "draft"), step(BETA, "check", 0), step(CONDUCTOR, "review")
    )
    succeed(machine, 0, "draft answer")
    requested(succeed(machine, 1, "checked answer"))
    return machine


def snapshot(machine: WorkflowMachine) -> dict[str, Any]:
    return machine.state.model_dump(mode="json")


def user(content: str) -> ChatMessage:
    return ChatMessage(role="user", content=content)


def assistant(content: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=content)


def first_of_round(subtask: str) -> ChatMessage:
    return user(f"Question: {QUESTION}\n\nYour task: {subtask}")


# -- start ------------------------------------------------------------------------------------


def test_start_records_a_started_event_numbered_0_with_the_workers_offered() -> None:
    machine = start()

    [event] = machine.take_events()

    assert (event.kind, event.sequence, event.workers) == (EventKind.STARTED, 0, ["alpha", "beta"])
    assert machine.result.status is WorkflowStatus.RUNNING
    assert machine.take_events() == []


def test_the_first_advance_requests_the_round_0_plan_and_the_second_issues_nothing() -> None:
    machine = start(ULTRA)

    first = machine.advance()
    second = machine.advance()

    assert requested(first) == RequestPlan(
        round=0,
        request=PlanRequest(
            question=QUESTION,
            pool=WITH_CONDUCTOR,
            max_steps=5,
            workflow_max_steps=5,
            round=0,
            prior=None,
            temperature=ULTRA.planner_temperature,
            max_tokens=ULTRA.planner_max_tokens,
        ),
    )
    assert second == []
    assert machine.state.planning_round == 0


@pytest.mark.parametrize(
    ("workflow_variant", "pool", "max_steps"),
    [
        (MINI, ENTRIES, 1),
        (ULTRA, WITH_CONDUCTOR, 5),
        (variant(recursion_rounds=0), ENTRIES, 5),
        (variant(max_steps=1, recursion_rounds=1), ENTRIES, 1),
    ],
    ids=["mini", "ultra", "no-recursion", "one-step-recursion"],
)
def test_the_conductor_is_offered_only_with_a_recursion_round_and_room_for_two_steps(
    workflow_variant: Variant, pool: list[PoolEntry], max_steps: int
) -> None:
    request = requested(start(workflow_variant).advance()).request

    assert (request.pool, request.max_steps) == (pool, max_steps)


def test_a_workflow_with_no_workers_fails_on_its_first_advance() -> None:
    machine = start(entries=[])
    machine.take_events()

    actions = machine.advance()

    assert actions == []
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.error == "no worker in the pool can be called"
    assert [(e.kind, e.sequence) for e in machine.take_events()] == [(EventKind.FAILED, 1)]


# -- plans ------------------------------------------------------------------------------------


def test_a_plan_is_recorded_as_steps_with_global_indices_and_a_plan_event() -> None:
    machine = start(ULTRA)
    request = requested(machine.advance()).request
    machine.take_events()
    plan = outcome(
        request.pool, step(ALPHA, "draft"), step(BETA, "check", 0), step(CONDUCTOR, "go")
    )

    assert machine.apply(PlanReady(0, plan))

    assert [
        (s.index, s.round, s.kind, s.worker, s.subtask, s.visible_steps, s.status)
        for s in machine.result.steps
    ] == [
        (0, 0, StepKind.WORKER, "alpha", "draft", [], StepStatus.PENDING),
        (1, 0, StepKind.WORKER, "beta", "check", [0], StepStatus.PENDING),
        (2, 0, StepKind.CONDUCTOR, "conductor", "go", [], StepStatus.PENDING),
    ]
    assert [c.round for c in machine.result.planner_calls] == [0]
    assert [(e.kind, e.sequence, e.round) for e in machine.take_events()] == [
        (EventKind.PLAN, 1, 0)
    ]


@pytest.mark.parametrize(("parallel", "first_dispatch"), [(True, [0, 1, 2]), (False, [0])])
def test_independent_steps_are_dispatched_together_only_in_a_parallel_variant(
    parallel: bool, first_dispatch: list[int]
) -> None:
    _, actions = planned(
        variant(parallel=parallel), step(ALPHA, "a"), step(BETA, "b"), step(ALPHA, "c")
    )

    assert dispatched(actions) == first_dispatch


def test_a_sequential_variant_runs_steps_one_at_a_time_in_index_order() -> None:
    machine, first = planned(
        variant(parallel=False), step(ALPHA, "a"), step(BETA, "b"), step(ALPHA, "c")
    )

    waiting = machine.advance()
    second = succeed(machine, 0, "A")
    third = succeed(machine, 1, "B")

    assert [dispatched(first), waiting, dispatched(second), dispatched(third)] == [
        [0],
        [],
        [1],
        [2],
    ]


def test_a_step_waits_for_the_steps_its_access_list_names() -> None:
    machine, first = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"), step(ALPHA, "c", 0, 1))

    after_one = succeed(machine, 0, "A")
    after_both = succeed(machine, 1, "B")

    assert [dispatched(first), after_one, dispatched(after_both)] == [[0, 1], [], [2]]
    assert machine.result.steps[2].status is StepStatus.RUNNING


def test_the_first_step_of_a_round_gets_the_users_question() -> None:
    _, [first] = planned(ULTRA, step(ALPHA, "name the river"))

    assert first == Dispatch(
        step=0,
        worker="alpha",
        messages=[first_of_round("name the river")],
        dispatch=1,
        allowed_workers=NAMES,
        expires_at=first.expires_at,
    )


def test_every_dispatch_names_the_workflows_tenant_and_a_resumed_state_keeps_it() -> None:
    # Given a workflow of tenant acme with its plan applied
    machine = WorkflowMachine.start(
        workflow_id=WORKFLOW_ID,
        question=QUESTION,
        variant=ULTRA,
        entries=list(ENTRIES),
        created_at=T0,
        tenant="acme",
    )
    request = requested(machine.advance()).request
    plan = outcome(request.pool, step(ALPHA, "name the river"), step(BETA, "check", ALL))
    assert machine.apply(PlanReady(0, plan))

    # When its state is stored and read back, and the machine advances
    resumed = WorkflowMachine(WorkflowState.model_validate_json(machine.state.model_dump_json()))
    [first] = resumed.advance()
    assert isinstance(first, Dispatch)
    assert resumed.apply(StepSucceeded(0, answer("the Nile")))
    [second] = resumed.advance()

    # Then each dispatch carries the tenant (the gateway gives its calls their fair turn)
    assert isinstance(second, Dispatch)
    assert (first.tenant, second.tenant) == ("acme", "acme")


@pytest.mark.parametrize(
    ("access", "messages"),
    [
        (
            (0, 1),
            [
                first_of_round("find facts"),
                assistant("facts"),
                user("find dates"),
                assistant("dates"),
                user("write"),
            ],
        ),
        (
            (ALL,),
            [
                first_of_round("find facts"),
                assistant("facts"),
                user("find dates"),
                assistant("dates"),
                user("write"),
            ],
        ),
        ((1,), [user("find dates"), assistant("dates"), user("write")]),
        ((), [user("write")]),
    ],
    ids=["both", "all", "second-only", "none"],
)
def test_a_dispatch_carries_exactly_the_visible_steps_subtasks_and_answers(
    access: tuple[AccessEntry, ...], messages: list[ChatMessage]
) -> None:
    machine, first = planned(
        ULTRA, step(ALPHA, "find facts"), step(BETA, "find dates"), step(ALPHA, "write", *access)
    )
    machine.apply(StepSucceeded(0, answer("facts")))
    machine.apply(StepSucceeded(1, answer("dates")))

    later = machine.advance()

    # A step that needs nothing goes out with the first two; the others once both answered.
    [sent] = [a for a in [*first, *later] if isinstance(a, Dispatch) and a.step == 2]
    assert sent == Dispatch(
        step=2,
        worker="alpha",
        messages=messages,
        dispatch=1,
        allowed_workers=NAMES,
        expires_at=sent.expires_at,
    )


def test_every_send_bounds_its_call_to_the_workflows_pool_in_every_round() -> None:
    """A workflow narrowed to one worker (a key's pool, a pool option) never lets a step's call
    reach another: not through the worker's fallbacks, not in a recursion round."""
    machine = start(ULTRA, entries=[ENTRIES[0]])
    request = requested(machine.advance()).request
    narrowed = [ENTRIES[0], CONDUCTOR_ENTRY]
    assert machine.apply(PlanReady(0, outcome(narrowed, step(0, "draft"), step(1, "replan"))))
    [first] = machine.advance()
    [plan_request] = succeed(machine, 0, "draft answer")
    assert machine.apply(PlanReady(1, outcome(narrowed, step(0, "polish"))))
    [second] = machine.advance()

    assert request.pool == narrowed
    assert isinstance(plan_request, RequestPlan)
    assert isinstance(first, Dispatch)
    assert isinstance(second, Dispatch)
    assert (first.allowed_workers, second.allowed_workers) == (["alpha"], ["alpha"])
    assert (second.step, second.worker) == (2, "alpha")


# -- duplicate and late facts -----------------------------------------------------------------


def test_a_second_answer_for_a_step_is_ignored_and_the_first_counts() -> None:
    machine, _ = planned(MINI, step(0, "name the river"))
    assert machine.apply(StepSucceeded(0, answer("the Seine")))
    before = snapshot(machine)
    machine.take_events()

    again = machine.apply(StepSucceeded(0, answer("the Loire")))

    assert again is False
    assert snapshot(machine) == before
    assert machine.take_events() == []
    machine.advance()
    assert machine.result.answer == "the Seine"


@pytest.mark.parametrize(("plan_first", "round_no"), [(False, 1), (True, 0), (True, 1)])
def test_a_plan_for_a_round_not_awaited_changes_nothing(plan_first: bool, round_no: int) -> None:
    machine = start(ULTRA)
    request = requested(machine.advance()).request
    if plan_first:
        machine.apply(PlanReady(0, outcome(request.pool, step(ALPHA, "a"))))
    before = snapshot(machine)
    machine.take_events()

    applied = machine.apply(PlanReady(round_no, outcome(request.pool, step(BETA, "late"))))

    assert applied is False
    assert snapshot(machine) == before
    assert machine.take_events() == []


@pytest.mark.parametrize("index", [1, 7, -1], ids=["pending", "unknown", "negative"])
def test_an_answer_for_a_step_that_is_not_running_changes_nothing(index: int) -> None:
    machine, _ = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b", 0))
    before = snapshot(machine)
    machine.take_events()

    applied = machine.apply(StepSucceeded(index, answer("stray")))

    assert applied is False
    assert snapshot(machine) == before
    assert machine.take_events() == []


@pytest.mark.parametrize(
    "fact",
    [
        PlanReady(0, outcome(ENTRIES, step(0, "again"))),
        PlanFailed(0, "late failure"),
        StepSucceeded(0, answer("late answer")),
        StepFailed(0, "late failure"),
        DeadlinesPassed(at(86_400)),
        Aborted("too late"),
    ],
    ids=lambda fact: type(fact).__name__,
)
def test_no_fact_applies_after_the_workflow_ended(fact: Fact) -> None:
    machine, _ = planned(MINI, step(0, "name the river"))
    succeed(machine, 0, "the Seine")
    assert machine.result.status is WorkflowStatus.COMPLETED
    before = snapshot(machine)
    machine.take_events()

    applied = machine.apply(fact)

    assert applied is False
    assert snapshot(machine) == before
    assert machine.take_events() == []
    assert machine.advance() == []


# -- failures ---------------------------------------------------------------------------------


def test_a_failed_step_fails_the_workflow_naming_the_step_and_the_reason() -> None:
    machine, _ = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"))

    applied = machine.apply(StepFailed(1, "StepCallFailed: HTTP 500"))

    assert applied is True
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.error == "step 1 (beta) failed: StepCallFailed: HTTP 500"
    assert (machine.result.steps[1].status, machine.result.steps[1].error) == (
        StepStatus.FAILED,
        "StepCallFailed: HTTP 500",
    )
    assert machine.result.answer is None


def test_a_failed_step_cancels_the_steps_still_pending_or_running() -> None:
    machine, _ = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"), step(ALPHA, "c", 0, 1))
    machine.take_events()

    machine.apply(StepFailed(0, "HTTP 500"))

    assert [s.status for s in machine.result.steps] == [
        StepStatus.FAILED,
        StepStatus.CANCELLED,
        StepStatus.CANCELLED,
    ]
    assert [(e.kind, e.step) for e in machine.take_events()] == [
        (EventKind.STEP_FINISHED, 0),
        (EventKind.STEP_FINISHED, 1),
        (EventKind.STEP_FINISHED, 2),
        (EventKind.FAILED, None),
    ]
    assert machine.advance() == []
    assert machine.apply(StepSucceeded(1, answer("late"))) is False


def test_a_failed_workflows_usage_and_cost_sum_the_plan_and_every_step() -> None:
    machine, _ = planned(
        ULTRA,
        step(ALPHA, "a"),
        step(BETA, "b", 0),
        usage=Usage(prompt_tokens=100, completion_tokens=20),
        cost=0.002,
    )
    machine.apply(
        StepSucceeded(0, answer("A", Usage(prompt_tokens=50, completion_tokens=10), 0.01))
    )
    machine.advance()
    attempts = tuple(
        AttemptRecord(
            number=n,
            worker="beta",
            status="error",
            error="HTTP 500",
            usage=Usage(prompt_tokens=40, completion_tokens=5),
            cost_usd=0.004,
            started_at=T0,
        )
        for n in (1, 2)
    )

    machine.apply(StepFailed(1, "HTTP 500", attempts))

    assert machine.result.steps[1].usage == Usage(prompt_tokens=80, completion_tokens=10)
    assert machine.result.steps[1].attempts == list(attempts)
    assert machine.result.usage == Usage(prompt_tokens=230, completion_tokens=40)
    assert machine.result.cost_usd == pytest.approx(0.02)


# -- completion -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["the Seine", ""], ids=["text", "empty"])
def test_the_last_worker_steps_answer_is_the_answer(text: str) -> None:
    machine, _ = planned(MINI, step(0, "name the river"))

    actions = succeed(machine, 0, text)

    assert actions == []
    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.answer == text
    assert machine.result.error is None


def test_the_answer_is_the_last_step_by_index_not_the_last_to_finish() -> None:
    machine, _ = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"))

    succeed(machine, 1, "from step 1")
    succeed(machine, 0, "from step 0")

    assert machine.result.answer == "from step 1"


def test_a_completed_workflows_events_are_numbered_from_1_and_end_with_completed() -> None:
    machine, _ = planned(MINI, step(0, "name the river"))
    succeed(machine, 0, "the Seine")

    events = [(e.kind, e.sequence, e.step, e.round) for e in machine.take_events()]

    assert events == [
        (EventKind.STARTED, 0, None, None),
        (EventKind.PLAN, 1, None, 0),
        (EventKind.STEP_STARTED, 2, 0, None),
        (EventKind.STEP_FINISHED, 3, 0, None),
        (EventKind.COMPLETED, 4, None, None),
    ]


def test_a_recursive_workflows_events_have_no_gaps_and_one_outcome_last() -> None:
    machine = awaiting_round_1()
    machine.apply(PlanReady(1, outcome(ENTRIES, step(ALPHA, "polish", ALL))))
    machine.advance()
    succeed(machine, 3, "final answer")

    events = machine.take_events()[1:]  # after STARTED

    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert [e.kind.final for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1].kind is EventKind.COMPLETED


def test_a_completed_workflows_usage_and_cost_sum_every_planner_call_and_step() -> None:
    machine, _ = planned(
        ULTRA,
        step(ALPHA, "draft"),
        step(BETA, "check", 0),
        step(CONDUCTOR, "review"),
        usage=Usage(prompt_tokens=100, completion_tokens=10),
        cost=0.01,
    )
    succeed(machine, 0, "draft answer", Usage(prompt_tokens=7, completion_tokens=3), 0.003)
    succeed(machine, 1, "checked answer", Usage(prompt_tokens=5, completion_tokens=1), 0.001)
    second_plan = outcome(
        ENTRIES,
        step(ALPHA, "polish"),
        usage=Usage(prompt_tokens=300, completion_tokens=30),
        cost=0.03,
    )
    machine.apply(PlanReady(1, second_plan))
    machine.advance()

    succeed(machine, 3, "final", Usage(prompt_tokens=20, completion_tokens=2), 0.0002)

    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.usage == Usage(prompt_tokens=432, completion_tokens=46)
    assert machine.result.cost_usd == pytest.approx(0.0442)


# -- recursion --------------------------------------------------------------------------------


def test_a_plan_ending_with_the_conductor_requests_the_next_round_after_the_other_steps() -> None:
    machine, first = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"), step(CONDUCTOR, "review"))

    after_one = succeed(machine, 0, "A")
    after_both = succeed(machine, 1, "B")
    waiting = machine.advance()

    assert dispatched(first) == [0, 1]
    assert after_one == []
    assert requested(after_both).round == 1
    assert waiting == []
    assert machine.result.steps[2].status is StepStatus.RUNNING


def test_the_next_rounds_request_carries_the_prior_plan_its_answers_and_a_smaller_budget() -> None:
    machine, _ = planned(
        ULTRA, step(ALPHA, "draft"), step(BETA, "check", 0), step(CONDUCTOR, "review")
    )
    succeed(machine, 0, "draft answer")

    request = requested(succeed(machine, 1, "checked answer")).request

    assert request == PlanRequest(
        question=QUESTION,
        pool=ENTRIES,
        max_steps=2,
        workflow_max_steps=ULTRA.max_steps,
        round=1,
        prior=PriorRound(
            plan=machine.result.planner_calls[0].plan,
            answers=["draft answer", "checked answer", None],
            last_answer="checked answer",
        ),
        temperature=ULTRA.planner_temperature,
        max_tokens=ULTRA.planner_max_tokens,
    )


def test_the_next_rounds_steps_continue_the_global_indices_and_give_the_answer() -> None:
    machine = awaiting_round_1()

    machine.apply(PlanReady(1, outcome(ENTRIES, step(BETA, "polish"))))
    [dispatch] = machine.advance()
    succeed(machine, 3, "final answer")

    conductor, polish = machine.result.steps[2], machine.result.steps[3]
    assert (conductor.status, conductor.output) == (
        StepStatus.SUCCEEDED,
        "the Conductor wrote 1 more step(s)",
    )
    assert (polish.index, polish.round, polish.worker) == (3, 1, "beta")
    assert dispatch == Dispatch(
        step=3,
        worker="beta",
        messages=[first_of_round("polish")],
        dispatch=1,
        allowed_workers=NAMES,
        expires_at=dispatch.expires_at,
    )
    assert machine.result.answer == "final answer"


def test_all_in_a_later_round_shows_every_earlier_worker_step_but_no_conductor_step() -> None:
    machine = awaiting_round_1()

    machine.apply(PlanReady(1, outcome(ENTRIES, step(ALPHA, "polish", ALL))))
    [dispatch] = machine.advance()

    assert isinstance(dispatch, Dispatch)
    assert machine.result.steps[3].visible_steps == [0, 1]
    assert dispatch.messages == [
        first_of_round("draft"),
        assistant("draft answer"),
        user("check"),
        assistant("checked answer"),
        first_of_round("polish"),
    ]


def test_a_stop_in_a_later_round_keeps_the_last_answer() -> None:
    machine = awaiting_round_1()

    applied = machine.apply(PlanReady(1, outcome(ENTRIES, stop=True)))
    actions = machine.advance()

    assert applied is True
    assert actions == []
    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.answer == "checked answer"
    assert machine.result.steps[2].output == "the Conductor stopped; the last answer stands"


def test_a_failed_plan_in_a_later_round_keeps_the_earlier_answer() -> None:
    machine = awaiting_round_1()

    applied = machine.apply(PlanFailed(1, "planner unreachable"))

    assert applied is True
    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.answer == "checked answer"
    conductor = machine.result.steps[2]
    assert (conductor.status, conductor.error) == (StepStatus.FAILED, "planner unreachable")


def test_a_failed_plan_in_round_0_fails_the_workflow() -> None:
    machine = start(ULTRA)
    machine.advance()

    applied = machine.apply(PlanFailed(0, "planner unreachable"))

    assert applied is True
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.error == "the Conductor failed to plan: planner unreachable"
    assert machine.advance() == []


def test_a_stop_in_round_0_fails_the_workflow_for_want_of_an_answer() -> None:
    machine = start(ULTRA)
    request = requested(machine.advance()).request
    machine.apply(PlanReady(0, outcome(request.pool, stop=True)))

    actions = machine.advance()

    assert actions == []
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.error == "no step produced an answer"


@pytest.mark.parametrize(("first_plan_steps", "max_steps"), [(2, 1), (3, 2), (5, 4)])
def test_the_next_round_may_add_fewer_steps_than_the_first_plan_had(
    first_plan_steps: int, max_steps: int
) -> None:
    workers = [step(ALPHA, f"part {i}") for i in range(first_plan_steps - 1)]
    machine, _ = planned(ULTRA, *workers, step(CONDUCTOR, "review"))
    actions: list[Action] = []
    for index in range(first_plan_steps - 1):
        actions = succeed(machine, index, f"answer {index}")

    request = requested(actions).request

    assert request.max_steps == max_steps
    assert len(machine.result.steps) + request.max_steps < 2 * first_plan_steps
    assert request.pool == ENTRIES  # the last recursion round offers no further one


def test_a_second_recursion_round_keeps_the_total_below_twice_the_first_plan() -> None:
    machine, _ = planned(
        variant(recursion_rounds=2),
        *[step(ALPHA, f"p{i}") for i in range(4)],
        step(CONDUCTOR, "review"),
    )
    for index in range(4):
        actions = succeed(machine, index, f"a{index}")
    round_1 = requested(actions).request
    machine.apply(
        PlanReady(
            1, outcome(round_1.pool, step(ALPHA, "r1"), step(BETA, "r2"), step(CONDUCTOR, "again"))
        )
    )
    machine.advance()
    succeed(machine, 5, "b5")

    round_2 = requested(succeed(machine, 6, "b6")).request

    assert (round_1.max_steps, round_1.pool) == (3, WITH_CONDUCTOR)
    assert (round_2.max_steps, round_2.pool) == (1, ENTRIES)
    assert len(machine.result.steps) + round_2.max_steps == 9  # fewer than 2 * 5


def test_a_plan_that_spends_the_whole_budget_gets_no_further_round() -> None:
    machine, _ = planned(
        variant(recursion_rounds=2),
        *[step(ALPHA, f"p{i}") for i in range(3)],
        step(CONDUCTOR, "review"),
    )
    for index in range(3):
        actions = succeed(machine, index, f"a{index}")
    pool = requested(actions).request.pool
    # The budget is 7 steps; this plan overshoots the 2 it was offered and reaches 7.
    machine.apply(
        PlanReady(1, outcome(pool, step(ALPHA, "x"), step(BETA, "y"), step(CONDUCTOR, "more")))
    )
    machine.advance()
    succeed(machine, 4, "x answer")

    actions = succeed(machine, 5, "y answer")

    assert actions == []
    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.answer == "y answer"
    assert machine.result.steps[6].status is StepStatus.CANCELLED
    assert len(machine.result.planner_calls) == 2


# -- deadlines --------------------------------------------------------------------------------


def test_deadlines_passed_before_any_deadline_changes_nothing() -> None:
    machine, _ = planned(TIMED, step(ALPHA, "a"))
    before = snapshot(machine)
    machine.take_events()

    applied = machine.apply(DeadlinesPassed(at(59)))

    assert applied is False
    assert snapshot(machine) == before
    assert machine.advance() == []
    assert machine.take_events() == []


def test_lost_messages_send_every_step_and_plan_request_in_flight_again_at_once() -> None:
    machine, _ = planned(TIMED, step(ALPHA, "a"), step(BETA, "b"), step(ALPHA, "c", 0))
    succeed(machine, 1, "B")

    applied = machine.apply(MessagesLost())
    again = machine.advance()
    twice = machine.apply(MessagesLost())

    # step 0 is in flight (sent again, counted), step 1 answered, step 2 never sent
    assert applied is True
    assert [(a.step, a.dispatch) for a in again if isinstance(a, Dispatch)] == [(0, 2)]
    assert twice is True  # still in flight: a second loss sends it once more
    assert [(a.step, a.dispatch) for a in machine.advance() if isinstance(a, Dispatch)] == [(0, 3)]
    # its answer, when it comes, counts once
    succeed(machine, 0, "A")
    assert machine.apply(StepSucceeded(0, answer("A again"))) is False


def test_lost_messages_ask_for_a_pending_plan_again() -> None:
    machine = start(TIMED)
    requested(machine.advance())

    assert machine.apply(MessagesLost()) is True
    [again] = machine.advance()
    assert isinstance(again, RequestPlan)
    assert (again.round, machine.state.plan_requests) == (0, 2)
    finished, _ = planned(TIMED, step(ALPHA, "a"))
    succeed(finished, 0, "A")
    assert finished.apply(MessagesLost()) is False


def test_a_step_past_its_deadline_is_sent_again_once_by_the_next_advance(clock: Clock) -> None:
    machine, [first] = planned(TIMED, step(ALPHA, "a"))

    applied = machine.apply(DeadlinesPassed(at(60)))
    clock.set(61)
    again = machine.advance()

    # Each send carries its own deadline: the step's, counted from that send
    assert applied is True
    assert isinstance(first, Dispatch)
    assert first.expires_at == at(60)
    assert again == [
        Dispatch(
            step=0,
            worker="alpha",
            messages=first.messages,
            dispatch=2,
            allowed_workers=NAMES,
            expires_at=at(61 + 60),
        )
    ]
    assert machine.advance() == []
    assert machine.result.steps[0].status is StepStatus.RUNNING


def test_deadlines_passed_twice_before_the_next_advance_still_sends_the_step_once(
    clock: Clock,
) -> None:
    machine, _ = planned(TIMED, step(ALPHA, "a"))
    first = machine.apply(DeadlinesPassed(at(60)))
    second = machine.apply(DeadlinesPassed(at(61)))
    clock.set(62)

    actions = machine.advance()

    assert (first, second) == (True, False)
    assert [(a.step, a.dispatch) for a in actions if isinstance(a, Dispatch)] == [(0, 2)]
    assert machine.state.dispatches == {0: 2}


def test_a_step_past_its_second_deadline_fails_the_workflow_with_the_reason(clock: Clock) -> None:
    machine, _ = planned(TIMED, step(ALPHA, "a"), step(BETA, "b", 0))
    machine.apply(DeadlinesPassed(at(60)))
    clock.set(61)
    machine.advance()

    early = machine.apply(DeadlinesPassed(at(120)))
    late = machine.apply(DeadlinesPassed(at(121)))

    assert (early, late) == (False, True)
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.error == "step 0 (alpha) failed: no answer within 60 s, sent 2 times"
    assert machine.result.steps[0].error == "no answer within 60 s, sent 2 times"
    assert machine.result.steps[1].status is StepStatus.CANCELLED


def test_an_answer_to_the_first_send_still_counts_after_a_resend(clock: Clock) -> None:
    machine, _ = planned(TIMED, step(ALPHA, "a"))
    machine.apply(DeadlinesPassed(at(60)))
    clock.set(61)
    machine.advance()

    first = machine.apply(StepSucceeded(0, answer("from the first send")))
    second = machine.apply(StepSucceeded(0, answer("from the second send")))
    machine.advance()

    assert (first, second) == (True, False)
    assert machine.result.answer == "from the first send"


def test_a_plan_request_past_its_deadline_is_sent_again_once(clock: Clock) -> None:
    machine = start(TIMED)
    [first] = machine.advance()

    applied = machine.apply(DeadlinesPassed(at(60)))
    clock.set(60)
    again = machine.advance()

    assert applied is True
    assert again == [first]
    assert machine.state.plan_requests == 2
    assert machine.advance() == []


def test_a_plan_request_past_its_second_deadline_fails_round_0(clock: Clock) -> None:
    machine = start(TIMED)
    machine.advance()
    machine.apply(DeadlinesPassed(at(60)))
    clock.set(60)
    machine.advance()

    early = machine.apply(DeadlinesPassed(at(119)))
    late = machine.apply(DeadlinesPassed(at(120)))

    assert (early, late) == (False, True)
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.error == (
        "the Conductor failed to plan: no plan within 60 s, asked 2 times"
    )


def test_a_later_rounds_plan_request_past_its_second_deadline_keeps_the_answer(
    clock: Clock,
) -> None:
    machine, _ = planned(TIMED, step(ALPHA, "draft"), step(CONDUCTOR, "review"))
    clock.set(10)
    requested(succeed(machine, 0, "draft answer"))
    machine.apply(DeadlinesPassed(at(70)))
    clock.set(70)
    assert requested(machine.advance()).round == 1

    machine.apply(DeadlinesPassed(at(130)))

    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.answer == "draft answer"
    assert machine.result.steps[1].error == "no plan within 60 s, asked 2 times"


def test_the_workflow_fails_at_its_own_deadline_and_cancels_its_running_steps() -> None:
    machine, _ = planned(TIMED, step(ALPHA, "a"), step(BETA, "b"))
    assert machine.apply(DeadlinesPassed(at(599.9))) is True  # the steps' resends, not the end
    machine.advance()
    assert not machine.state.finished

    applied = machine.apply(DeadlinesPassed(at(600)))

    assert applied is True
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.error == "no answer within the workflow deadline of 600 s"
    assert [s.status for s in machine.result.steps] == [StepStatus.CANCELLED] * 2
    assert machine.next_deadline() is None


def test_next_deadline_moves_with_each_send(clock: Clock) -> None:
    machine = start(TIMED)
    seen = [machine.next_deadline()]
    machine.advance()  # the plan request, at 0 s
    seen.append(machine.next_deadline())
    clock.set(30)
    machine.apply(PlanReady(0, outcome(ENTRIES, step(ALPHA, "a"))))
    seen.append(machine.next_deadline())
    machine.advance()  # the step, at 30 s
    seen.append(machine.next_deadline())
    machine.apply(DeadlinesPassed(at(90)))
    clock.set(95)
    machine.advance()  # the step again, at 95 s
    seen.append(machine.next_deadline())

    succeed(machine, 0, "A")

    assert seen == [at(600), at(60), at(600), at(90), at(155)]
    assert machine.next_deadline() is None


def test_next_deadline_is_never_later_than_the_workflow_deadline(clock: Clock) -> None:
    machine = start(variant(workflow_timeout_s=90))
    machine.advance()
    machine.apply(DeadlinesPassed(at(60)))
    clock.set(60)

    machine.advance()

    assert machine.next_deadline() == at(90)


# -- persistence ------------------------------------------------------------------------------

ADVANCE = "advance"
SCRIPT: list[Fact | str] = [
    ADVANCE,
    PlanReady(
        0,
        outcome(
            WITH_CONDUCTOR, step(ALPHA, "draft"), step(BETA, "check", 0), step(CONDUCTOR, "review")
        ),
    ),
    ADVANCE,
    DeadlinesPassed(at(60)),
    ADVANCE,
    StepSucceeded(0, answer("draft answer")),
    StepSucceeded(0, answer("duplicate")),
    ADVANCE,
    StepSucceeded(1, answer("checked answer")),
    ADVANCE,
    PlanReady(1, outcome(ENTRIES, step(ALPHA, "polish", ALL))),
    ADVANCE,
    StepSucceeded(3, answer("final answer")),
    ADVANCE,
]


def run_script(rebuild_before: int | None) -> tuple[list[Any], WorkflowMachine]:
    """Runs SCRIPT, storing and reloading the machine before op ``rebuild_before``."""
    machine = start(TIMED)
    trace: list[Any] = [machine.take_events()]
    for number, op in enumerate(SCRIPT):
        if number == rebuild_before:
            stored = machine.state.model_dump(mode="json")
            machine = WorkflowMachine(WorkflowState.model_validate(stored))
        result = machine.advance() if isinstance(op, str) else machine.apply(op)
        trace.append((result, machine.take_events()))
    return trace, machine


@pytest.mark.parametrize("rebuild_before", range(len(SCRIPT)))
def test_a_machine_rebuilt_from_its_stored_state_continues_identically(
    rebuild_before: int,
) -> None:
    expected, reference = run_script(rebuild_before=None)
    assert reference.result.answer == "final answer"

    trace, rebuilt = run_script(rebuild_before)

    assert trace == expected
    assert snapshot(rebuilt) == snapshot(reference)


def test_a_stored_state_that_says_profile_instead_of_variant_loads() -> None:
    machine, _ = planned(TIMED, step(ALPHA, "a"))
    stored = machine.state.model_dump(mode="json")
    stored["profile"] = stored.pop("variant")

    state = WorkflowState.model_validate(stored)

    assert state.variant == TIMED
    assert dispatched(WorkflowMachine(state).advance()) == []


# -- the answer's form -------------------------------------------------------------------------

JSON_FORM = AnswerFormat(type="json_object")


def _json_workflow(*steps: PlanStep) -> tuple[WorkflowMachine, list[Action]]:
    machine = WorkflowMachine.start(
        workflow_id=WORKFLOW_ID,
        question=QUESTION,
        variant=ULTRA,
        entries=list(ENTRIES),
        created_at=T0,
        answer_format=JSON_FORM,
    )
    request = requested(machine.advance()).request
    assert machine.apply(PlanReady(0, outcome(request.pool, *steps)))
    return machine, machine.advance()


def test_only_the_step_that_writes_the_answer_is_told_its_form() -> None:
    machine, first = _json_workflow(step(ALPHA, "find facts"), step(BETA, "write it", 0))
    [later] = succeed(machine, 0, "facts")

    assert isinstance(first[0], Dispatch)
    assert isinstance(later, Dispatch)
    assert "JSON" not in first[0].messages[-1].content
    assert later.messages[-1].content.endswith(JSON_FORM.instruction())


def test_only_the_step_that_writes_the_answer_asks_its_provider_for_the_form() -> None:
    machine, first = _json_workflow(step(ALPHA, "find facts"), step(BETA, "write it", 0))
    [later] = succeed(machine, 0, "facts")

    assert isinstance(first[0], Dispatch)
    assert isinstance(later, Dispatch)
    assert first[0].answer_format is None
    assert later.answer_format == JSON_FORM


def test_the_answer_is_kept_as_the_json_it_holds() -> None:
    machine, _ = _json_workflow(step(ALPHA, "answer"))
    succeed(machine, 0, 'Here: ```json\n{"answer": 42}\n```')

    assert machine.result.status is WorkflowStatus.COMPLETED
    assert machine.result.answer == '{"answer":42}'


def test_an_answer_without_the_json_asked_for_fails_the_workflow_with_the_reason() -> None:
    machine, _ = _json_workflow(step(ALPHA, "answer"))
    succeed(machine, 0, "forty-two")

    assert machine.result.status is WorkflowStatus.FAILED
    assert "does not follow response_format: the answer is not JSON" in (machine.result.error or "")


# -- abort ------------------------------------------------------------------------------------


def test_aborted_ends_a_running_workflow_as_failed_and_cancels_its_running_steps() -> None:
    machine, _ = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"), step(ALPHA, "c", 0))
    machine.take_events()

    applied = machine.apply(Aborted("cancelled by the user"))

    assert applied is True
    assert (machine.result.status, machine.result.error) == (
        WorkflowStatus.FAILED,
        "cancelled by the user",
    )
    assert [s.status for s in machine.result.steps] == [StepStatus.CANCELLED] * 3
    assert machine.take_events()[-1].kind is EventKind.FAILED
    assert machine.advance() == []


def test_cancelled_ends_a_running_workflow_cancelled_and_cancels_its_running_steps() -> None:
    machine, _ = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"), step(ALPHA, "c", 0))
    machine.take_events()

    applied = machine.apply(Cancelled("its client went away"))
    again = machine.apply(Cancelled())
    late = machine.apply(StepSucceeded(0, answer("too late")))

    assert (applied, again, late) == (True, False, False)
    assert (machine.result.status, machine.result.error) == (
        WorkflowStatus.CANCELLED,
        "its client went away",
    )
    assert machine.result.status.terminal
    assert [s.status for s in machine.result.steps] == [StepStatus.CANCELLED] * 3
    event = machine.take_events()[-1]
    assert event.kind is EventKind.CANCELLED
    assert event.kind.final
    assert machine.advance() == []


def test_calls_a_cancelled_step_made_are_recorded_when_they_are_reported_late() -> None:
    """Each may be billed (issue 36 #12): kept on the step, counted in the totals, announced to
    traces by an unnumbered event after the outcome; the step's first report of them stands."""
    machine, _ = planned(ULTRA, step(ALPHA, "a"), step(BETA, "b"))
    machine.apply(Cancelled())
    machine.take_events()
    calls = tuple(
        AttemptRecord(
            number=n,
            worker="alpha",
            status="error",
            status_code=429,
            usage=Usage(prompt_tokens=5),
            cost_usd=0.25,
            started_at=at(n),
        )
        for n in (1, 2)
    )

    recorded = machine.apply(StepFailed(0, "cancelled with its workflow", calls))
    again = machine.apply(StepFailed(0, "cancelled with its workflow", calls[:1]))
    untouched = machine.apply(StepFailed(1, "cancelled with its workflow", ()))

    assert (recorded, again, untouched) == (True, False, False)
    cancelled = machine.result.steps[0]
    assert cancelled.status is StepStatus.CANCELLED
    assert cancelled.attempts == list(calls)
    assert (cancelled.usage.prompt_tokens, cancelled.cost_usd) == (10, 0.5)
    assert (machine.result.usage.prompt_tokens, machine.result.cost_usd) == (
        machine.result.planner_calls[0].usage.prompt_tokens + 10,
        machine.result.planner_calls[0].cost_usd + 0.5,
    )
    [event] = machine.take_events()
    assert (event.kind, event.sequence, event.step) == (EventKind.ATTEMPTS, 0, 0)
    assert machine.result.status is WorkflowStatus.CANCELLED


def test_a_finished_workflow_is_not_cancelled() -> None:
    machine, _ = planned(MINI, step(ALPHA, "a"))
    succeed(machine, 0, "42")

    assert machine.apply(Cancelled()) is False
    assert machine.result.status is WorkflowStatus.COMPLETED


def test_aborted_while_a_plan_is_awaited_makes_the_late_plan_not_apply() -> None:
    machine = start(ULTRA)
    request = requested(machine.advance()).request

    aborted = machine.apply(Aborted("refused"))
    late = machine.apply(PlanReady(0, outcome(request.pool, step(ALPHA, "a"))))

    assert (aborted, late) == (True, False)
    assert machine.result.status is WorkflowStatus.FAILED
    assert machine.result.planner_calls == []
    assert machine.state.planning_round is None
