"""A workflow's progress as a reasoning item's summary (``progress_summary``): the facts told
from its events as they come (a streamed response) are the facts told from the stored
workflow (a response read back), and they say what ran, never what a step wrote. The workflows
are driven through the state machine, as both runtimes drive it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

import conductor.machine as machine_module
from conductor.chat import Usage
from conductor.machine import (
    CONDUCTOR_ENTRY,
    PlanReady,
    StepFailed,
    StepSucceeded,
    WorkflowMachine,
    event_row,
)
from conductor.ports import StepCallResult
from conductor.variants import BUILTIN_VARIANTS
from conductor.workflow import AccessEntry, Plan, PlanOutcome, PlanStep, PoolEntry
from conductor_api.progress_summary import MAX_SUBTASK_CHARS, ProgressFacts, workflow_facts
from conductor_api.schemas import EventView, StepView, UsageView, WorkflowView

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
POOL = [
    PoolEntry(name="fast", description="A generalist."),
    PoolEntry(name="strong", description="A careful checker."),
    CONDUCTOR_ENTRY,
]
FAST, STRONG, CONDUCTOR = 0, 1, 2
LONG = "Work out the sum of the series term by term, showing each partial sum. " * 6


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that moves a millisecond a reading: the steps end in the order they are told."""
    now = [T0]

    def tick() -> datetime:
        now[0] += timedelta(milliseconds=1)
        return now[0]

    monkeypatch.setattr(machine_module, "utcnow", tick)


def _step(model_id: int, subtask: str, *access: AccessEntry) -> PlanStep:
    return PlanStep(model_id=model_id, subtask=subtask, access_list=access)


def _plan(round_no: int, *steps: PlanStep, stop: bool = False) -> PlanReady:
    outcome = PlanOutcome(
        raw_output="(the Conductor's text)",
        valid=True,
        plan=Plan(steps=steps),
        stop=stop,
        pool=POOL,
    )
    return PlanReady(round_no, outcome)


def _answer(text: str) -> StepCallResult:
    return StepCallResult(text=text, worker="fast", usage=Usage(), cost_usd=0.0, attempts=[])


class _Run:
    """A conductor-ultra workflow on the state machine, its events kept as a client reads them."""

    def __init__(self) -> None:
        self.machine = WorkflowMachine.start(
            workflow_id=uuid.uuid4(),
            question="What is the sum?",
            variant=BUILTIN_VARIANTS["conductor-ultra"],
            entries=POOL[:2],
            created_at=T0,
        )
        self.events: list[EventView] = []
        self.advance()

    def apply(self, *facts: object) -> None:
        for fact in facts:
            assert self.machine.apply(fact)  # type: ignore[arg-type]
            self.advance()

    def advance(self) -> None:
        self.machine.advance()
        record = self.machine.result
        for event in self.machine.take_events():
            if event.sequence:  # the ones clients read
                row = event_row(record, event)
                self.events.append(
                    EventView(
                        workflow_id=record.workflow_id,
                        sequence=row["sequence"],
                        kind=row["kind"],
                        at=row["at"],
                        data=row["payload"],
                    )
                )

    def streamed(self) -> list[str]:
        facts = ProgressFacts()
        return [fact for event in self.events for fact in facts.event(event)]

    def stored(self) -> list[str]:
        record = self.machine.result
        view = WorkflowView(
            id=record.workflow_id,
            status=record.status.value,
            variant=record.variant,
            question=record.question,
            metadata={},
            plan_valid=record.plan_valid,
            planner_calls=record.planner_calls,
            steps=[StepView(**s.model_dump()) for s in record.steps],
            answer=record.answer,
            error=record.error,
            usage=UsageView(prompt_tokens=0, completion_tokens=0, total_tokens=0),
            cost_usd=0.0,
            latency_ms=0.0,
            feedback=None,
            created_at=record.created_at,
            finished_at=record.finished_at,
        )
        return workflow_facts(view)


def test_a_reviewed_round_then_an_answering_round_tell_the_same_facts_streamed_and_stored() -> None:
    run = _Run()
    run.apply(
        _plan(
            0,
            _step(FAST, "Solve the equation."),
            _step(STRONG, "Check step 1.", 0),
            _step(CONDUCTOR, "Review the answers."),
        ),
        StepSucceeded(0, _answer("x = 4, the draft")),
        StepSucceeded(1, _answer("x = 4, checked")),
        _plan(1, _step(STRONG, LONG)),
        StepSucceeded(3, _answer("The answer is 4.")),
    )

    facts = run.streamed()
    assert run.machine.result.answer == "The answer is 4."
    cut = " ".join(LONG.split())[: MAX_SUBTASK_CHARS - 1].rstrip() + "…"
    assert facts == [
        "Plan (round 1): 1. fast: Solve the equation. 2. strong: Check step 1. "
        "3. Conductor: Review the answers.",
        "Step 1 (fast) done.",
        "Step 2 (strong) done.",  # the answer of a reviewed round: a later round may replace it
        f"Plan (round 2): 4. strong: {cut}",
        # the Conductor's step (round 2's plan tells it) and the answering step are not told
    ]
    assert run.stored() == facts
    assert not [f for f in facts for out in ("x = 4", "The answer is 4.") if out in f]


def test_a_failed_step_and_the_steps_cancelled_with_it_are_told_with_the_reason_cut() -> None:
    run = _Run()
    run.apply(
        _plan(0, _step(FAST, "Solve\n  it."), _step(STRONG, "Check it.", 0)),
        StepFailed(0, "timed out " + "waiting " * 60),
    )

    facts = run.streamed()
    assert run.machine.result.status.value == "failed"
    assert facts[0] == "Plan (round 1): 1. fast: Solve it. 2. strong: Check it."
    assert facts[1].startswith("Step 1 (fast) failed: timed out waiting")
    assert len(facts[1]) == len("Step 1 (fast) failed: ") + 200
    assert facts[2:] == ["Step 2 (strong) cancelled."]
    assert run.stored() == facts


def test_a_round_the_conductor_ends_is_told_as_such() -> None:
    run = _Run()
    run.apply(
        _plan(0, _step(FAST, "Draft."), _step(CONDUCTOR, "Review.", 0)),
        StepSucceeded(0, _answer("draft")),
        _plan(1, stop=True),
    )

    assert run.streamed() == [
        "Plan (round 1): 1. fast: Draft. 2. Conductor: Review.",
        "Step 1 (fast) done.",
        "Plan (round 2): the Conductor planned no more; the last answer stands.",
    ]
    assert run.stored() == run.streamed()
