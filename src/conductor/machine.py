"""The workflow state machine that both runtimes drive: plan, dispatch ready steps, recurse, end.

It performs no I/O, and it has one way in and one way out:

- in: ``apply(fact)``, a typed fact of what happened (a plan arrived or failed, a step answered
  or failed, deadlines passed, the workflow was aborted);
- out: ``advance()``, the actions now due (request a plan, dispatch steps, send lost ones again),
  and ``take_events()``, what the machine recorded, for observers and traces.

The embedded executor drives it from asyncio tasks; the distributed aggregator loads it from
the database under a row lock for each queue message. Every fact checks that it still applies,
so a duplicate or late delivery changes nothing (``apply`` returns False).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, Field

from conductor.answer_format import AnswerFormat, AnswerFormatError
from conductor.chat import ChatMessage, ToolCall, ToolUse, Usage
from conductor.orchestration import (
    CONDUCTOR_WORKER,
    build_messages,
    recursion_budget,
    resolve_visible_steps,
    round_limits,
)
from conductor.ports import PlanRequest, PriorRound, StepCallResult
from conductor.variants import Variant
from conductor.workflow import (
    AttemptRecord,
    PlanOutcome,
    PoolEntry,
    StepKind,
    StepRecord,
    StepStatus,
    WorkflowRecord,
    WorkflowStatus,
    attempts_total,
)

NO_TOOL_WORKER = "tools were offered, and no worker of this workflow's pool takes tools"
CONDUCTOR_ENTRY = PoolEntry(name=CONDUCTOR_WORKER, description="the Conductor", is_conductor=True)
MAX_SENDS = 2  # a step or plan request is sent at most this often before it fails


def utcnow() -> datetime:
    return datetime.now(UTC)


class EventKind(StrEnum):
    STARTED = "started"  # the workflow was accepted (not streamed to clients; traces need it)
    PLAN = "plan"
    STEP_STARTED = "step_started"
    STEP_FINISHED = "step_finished"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Calls that a step its workflow's end cancelled had made, reported after that end: each
    # may be billed, so traces keep them (not streamed to clients: it follows the outcome).
    ATTEMPTS = "attempts"

    @property
    def final(self) -> bool:
        """The workflow's outcome: no event comes after it."""
        return self in (EventKind.COMPLETED, EventKind.FAILED, EventKind.CANCELLED)


FINAL_EVENT_KINDS = frozenset(k.value for k in EventKind if k.final)


class MachineEvent(BaseModel):
    """Something that happened; its payload is read from the state when it is delivered."""

    kind: EventKind
    sequence: int
    at: datetime
    step: int | None = None  # STEP_*: the step's global index
    round: int | None = None  # PLAN: the planning round
    workers: list[str] | None = None  # STARTED: the workers offered, as the Conductor sees them


# -- facts: what happened, applied by WorkflowMachine.apply -------------------------------------


@dataclass(frozen=True)
class PlanReady:
    """The Conductor answered a planning round (its plan may be invalid: the planner records
    that and hands over the fallback plan)."""

    round: int
    outcome: PlanOutcome


@dataclass(frozen=True)
class PlanFailed:
    """No plan came for a round (the planner failed or could not be reached)."""

    round: int
    error: str


@dataclass(frozen=True)
class StepSucceeded:
    step: int
    call: StepCallResult


@dataclass(frozen=True)
class StepFailed:
    step: int
    error: str
    attempts: tuple[AttemptRecord, ...] = ()


@dataclass(frozen=True)
class DeadlinesPassed:
    """The clock reached ``now``: lost steps and plan requests are sent again once, then fail;
    a workflow past its own deadline fails."""

    now: datetime


@dataclass(frozen=True)
class MessagesLost:
    """The queue lost its messages (a broker restarted without them): every step and plan
    request in flight is sent again now, not at its deadline. A reply that does arrive after
    all still counts once: a step's first answer wins."""


@dataclass(frozen=True)
class Aborted:
    """The workflow ends without an answer (its runtime stopped, timed out in its driver, or
    refused): it failed."""

    reason: str


@dataclass(frozen=True)
class Cancelled:
    """Its client cancelled the workflow, or went away while waiting for its answer: it ends
    cancelled, and the steps still running are cancelled with it."""

    reason: str = "cancelled by its client"


Fact = (
    PlanReady
    | PlanFailed
    | StepSucceeded
    | StepFailed
    | DeadlinesPassed
    | MessagesLost
    | Aborted
    | Cancelled
)


class Dispatch(BaseModel):
    """Run a step on its worker; ``dispatch`` counts sends of this step (resends after loss)."""

    step: int
    worker: str
    messages: list[ChatMessage]
    dispatch: int
    # The workflow's pool: the only workers the call may reach, the worker's fallbacks included.
    allowed_workers: list[str]
    tenant: str | None = None  # whose workflow: its calls take a fair turn on busy workers
    # The client's functions and the answer's form: for the step that writes its round's
    # answer only.
    tools: ToolUse | None = None
    answer_format: AnswerFormat | None = None
    # Whether its answer streams to the client as the worker writes it (see
    # ``WorkflowMachine._streams``).
    streams: bool = False
    # The step's deadline for this send: past it the step is sent again or fails, so nobody
    # waits for the answer of this send any longer.
    expires_at: datetime


class RequestPlan(BaseModel):
    round: int
    request: PlanRequest


Action = Dispatch | RequestPlan


class WorkflowState(BaseModel):
    """Everything needed to resume a workflow: what the database keeps per workflow."""

    result: WorkflowRecord
    # Stored states from before the rename say "profile".
    variant: Variant = Field(validation_alias=AliasChoices("variant", "profile"))
    entries: list[PoolEntry]  # the workers the Conductor sees as Model 0..N-1
    planning_round: int | None = None  # a plan requested and not yet applied
    plan_requested_at: datetime | None = None
    plan_requests: int = 0  # sends of the current plan request
    dispatches: dict[int, int] = Field(default_factory=dict)  # step index -> sends
    dispatched_at: dict[int, datetime] = Field(default_factory=dict)  # step index -> last send
    # Sends that passed deadlines call for; advance() issues them.
    resend_plan: bool = False
    resend_steps: list[int] = Field(default_factory=list)
    event_sequence: int = 0
    # The form the client requires of the answer (response_format); None: any text.
    answer_format: AnswerFormat | None = None
    # Whose workflow it is (an API key's tenant); None: nobody's in particular.
    tenant: str | None = None
    # The functions the client offers; only the step that writes a round's answer is given
    # them, and it may answer with calls for the client to run. None: no tools.
    tools: ToolUse | None = None
    # The pool's workers whose wire format carries tools, in pool order: while tools are
    # offered, the answering step runs on one of them.
    tool_workers: list[str] = Field(default_factory=list)
    # Whether its client streams the answer: the final answering step's text then goes to
    # it as the worker writes it.
    stream_answer: bool = False

    @property
    def finished(self) -> bool:
        return self.result.status.terminal


class WorkflowMachine:
    def __init__(self, state: WorkflowState) -> None:
        self.state = state
        self.events: list[MachineEvent] = []

    @classmethod
    def start(
        cls,
        *,
        workflow_id: Any,
        question: str,
        variant: Variant,
        entries: list[PoolEntry],
        created_at: datetime | None = None,
        answer_format: AnswerFormat | None = None,
        tenant: str | None = None,
        tools: ToolUse | None = None,
        tool_workers: Sequence[str] = (),
        stream_answer: bool = False,
    ) -> WorkflowMachine:
        """A new workflow. With ``tools``, a one-step variant's Conductor sees only the
        ``tool_workers`` (its one step answers), and a workflow whose pool has none of them
        fails at once."""
        takes_tools = set(tool_workers)
        takers = [e for e in entries if e.name in takes_tools] if tools else entries
        if tools is not None and variant.max_steps == 1:
            entries = takers
        result = WorkflowRecord(
            workflow_id=workflow_id,
            variant=variant.name,
            question=question,
            status=WorkflowStatus.RUNNING,
            planner_calls=[],
            steps=[],
            created_at=created_at or utcnow(),
        )
        state = WorkflowState(
            result=result,
            variant=variant,
            entries=entries,
            answer_format=answer_format,
            tenant=tenant,
            tools=tools,
            tool_workers=[e.name for e in takers] if tools else [],
            stream_answer=stream_answer,
        )
        machine = cls(state)
        machine._emit(EventKind.STARTED, workers=[e.name for e in entries])
        if tools is not None and not takers:
            machine._fail(NO_TOOL_WORKER)
        return machine

    @property
    def result(self) -> WorkflowRecord:
        return self.state.result

    def take_events(self) -> list[MachineEvent]:
        """The events recorded since the last call, oldest first."""
        events, self.events = self.events, []
        return events

    # -- the way in -------------------------------------------------------------------------

    def apply(self, fact: Fact) -> bool:
        """Apply what happened; False when it no longer applies (a duplicate or late delivery,
        a finished workflow) and nothing changed."""
        match fact:
            case PlanReady(round=round_no, outcome=outcome):
                return self._plan_ready(round_no, outcome)
            case PlanFailed(round=round_no, error=error):
                return self._plan_failed(round_no, error)
            case StepSucceeded(step=index, call=call):
                return self._step_succeeded(index, call) or self._late_attempts(
                    index, call.attempts
                )
            case StepFailed(step=index, error=error, attempts=attempts):
                return self._step_failed(index, error, list(attempts)) or self._late_attempts(
                    index, attempts
                )
            case DeadlinesPassed(now=now):
                return self._deadlines_passed(now)
            case MessagesLost():
                return self._messages_lost()
            case Aborted(reason=reason):
                return self._fail(reason)
            case Cancelled(reason=reason):
                return self._cancel(reason)

    # -- the way out ------------------------------------------------------------------------

    def advance(self) -> list[Action]:
        """The actions the state calls for now, marked as issued (so never issued twice):
        sends that passed deadlines called for, then what the plan makes due."""
        state, result = self.state, self.state.result
        if state.finished:
            return []
        actions = self._resends()
        if state.planning_round is not None:
            return actions
        if not result.planner_calls:
            if not state.entries:
                self._fail("no worker in the pool can be called")
                return []
            return [self._request_plan(0)]
        round_no = result.planner_calls[-1].round
        records = [s for s in result.steps if s.round == round_no]
        if not records:  # a plan that stopped: the last answer stands
            self._complete()
            return []
        dispatches = [self._dispatch(s) for s in self._ready(records)]
        actions.extend(dispatches)
        if dispatches or any(s.kind is StepKind.WORKER and s.status.active for s in records):
            return actions
        last = records[-1]
        # A round whose answer asks for the client's functions ends the workflow: the client
        # runs them, and its next request (with their results) is a new workflow.
        calls = any(s.tool_calls for s in records)
        if last.kind is StepKind.CONDUCTOR and last.status is StepStatus.PENDING and not calls:
            request = self.plan_request(round_no + 1)
            if request.max_steps >= 1:
                self._mark_started(last)
                return [*actions, self._request_plan(round_no + 1, request)]
        self._complete()
        return []

    def _ready(self, records: list[StepRecord]) -> list[StepRecord]:
        done = {s.index for s in self.result.steps if s.status is StepStatus.SUCCEEDED}
        workers = [s for s in records if s.kind is StepKind.WORKER]
        ready = [
            s
            for s in workers
            if s.status is StepStatus.PENDING and all(i in done for i in s.visible_steps)
        ]
        if self.state.variant.parallel:
            return ready
        if any(s.status is StepStatus.RUNNING for s in workers):
            return []
        return ready[:1]

    def _dispatch(self, step: StepRecord) -> Dispatch:
        self._mark_started(step)
        return self._send(step)

    def _send(self, step: StepRecord) -> Dispatch:
        """A send of a step's call, the first or a resend: counted, and its time kept for the
        step's deadline."""
        by_index = {s.index: s for s in self.result.steps}
        messages = build_messages(self.result.question, step, by_index)
        form = self.state.answer_format
        answers = self._writes_the_answer(step)
        if form is not None and answers:
            last = messages[-1]
            messages[-1] = last.model_copy(
                update={"content": f"{last.content}\n\n{form.instruction()}"}
            )
        sends = self.state.dispatches.get(step.index, 0) + 1
        sent_at = utcnow()
        self.state.dispatches[step.index] = sends
        self.state.dispatched_at[step.index] = sent_at
        return Dispatch(
            step=step.index,
            worker=step.worker,
            messages=messages,
            dispatch=sends,
            allowed_workers=[entry.name for entry in self.state.entries],
            tenant=self.state.tenant,
            tools=self.state.tools if answers else None,
            answer_format=form if answers else None,
            streams=answers and self._streams(step),
            expires_at=sent_at + timedelta(seconds=self.state.variant.step_timeout_s),
        )

    def _request_plan(self, round_no: int, request: PlanRequest | None = None) -> RequestPlan:
        self.state.planning_round = round_no
        self.state.plan_requested_at = utcnow()
        self.state.plan_requests = 1
        return RequestPlan(round=round_no, request=request or self.plan_request(round_no))

    def _resends(self) -> list[Action]:
        """Send again what passed its deadline (its message or its answer was lost)."""
        state = self.state
        actions: list[Action] = []
        if state.resend_plan and state.planning_round is not None:
            state.plan_requested_at = utcnow()
            state.plan_requests += 1
            round_no = state.planning_round
            actions.append(RequestPlan(round=round_no, request=self.plan_request(round_no)))
        for index in state.resend_steps:
            step = self._step(index)
            if step is not None and step.status is StepStatus.RUNNING:
                actions.append(self._send(step))
        state.resend_plan, state.resend_steps = False, []
        return actions

    def plan_request(self, round_no: int) -> PlanRequest:
        """What the Conductor is asked in a round: derived from the state, so any aggregator
        replica builds the same request."""
        variant, result = self.state.variant, self.result
        steps_left = None
        prior = None
        if round_no > 0:
            steps_left = recursion_budget(len(result.planner_calls[0].plan.steps)) - len(
                result.steps
            )
            previous = result.planner_calls[round_no - 1]
            records = [s for s in result.steps if s.round == round_no - 1]
            prior = PriorRound(
                plan=previous.plan,
                answers=[s.output for s in records],
                last_answer=(records[-2].output or "") if len(records) >= 2 else "",
            )
        max_steps, offer = round_limits(
            variant_max_steps=variant.max_steps,
            rounds_left=variant.recursion_rounds - round_no,
            steps_left=steps_left,
        )
        entries = self.state.entries
        return PlanRequest(
            question=result.question,
            pool=[*entries, CONDUCTOR_ENTRY] if offer else list(entries),
            max_steps=max_steps,
            workflow_max_steps=variant.max_steps,
            round=round_no,
            prior=prior,
            temperature=variant.planner_temperature,
            max_tokens=variant.planner_max_tokens,
            cost_weight=variant.router_cost_weight,
        )

    # -- deadlines --------------------------------------------------------------------------

    def next_deadline(self) -> datetime | None:
        """When ``expire`` next has something to do: the database indexes this."""
        state, variant = self.state, self.state.variant
        if state.finished:
            return None
        step_timeout = timedelta(seconds=variant.step_timeout_s)
        times = [self.result.created_at + timedelta(seconds=variant.workflow_timeout_s)]
        if state.planning_round is not None and state.plan_requested_at is not None:
            times.append(state.plan_requested_at + step_timeout)
        times.extend(self._sent_at(step) + step_timeout for step in self._running_workers())
        return min(times)

    def _deadlines_passed(self, now: datetime) -> bool:
        """A lost step or plan request is sent once more (by the next ``advance``), then fails;
        the workflow fails at its own deadline."""
        state, variant = self.state, self.state.variant
        if state.finished:
            return False
        if now >= self.result.created_at + timedelta(seconds=variant.workflow_timeout_s):
            return self._fail(
                f"no answer within the workflow deadline of {variant.workflow_timeout_s:g} s"
            )
        step_timeout = timedelta(seconds=variant.step_timeout_s)
        changed = False
        requested = state.plan_requested_at
        if state.planning_round is not None and requested and now >= requested + step_timeout:
            if state.plan_requests < MAX_SENDS:
                changed = self._resend_plan() or changed
            else:
                changed = True
                self._plan_failed(
                    state.planning_round,
                    f"no plan within {variant.step_timeout_s:g} s, asked {state.plan_requests} "
                    "times",
                )
        for step in self._running_workers():
            if now < self._sent_at(step) + step_timeout or state.finished:
                continue
            sends = state.dispatches.get(step.index, 0)
            if sends < MAX_SENDS:
                changed = self._resend_step(step.index) or changed
            else:
                changed = True
                self._step_failed(
                    step.index,
                    f"no answer within {variant.step_timeout_s:g} s, sent {sends} times",
                    [],
                )
        return changed

    def _messages_lost(self) -> bool:
        if self.state.finished:
            return False
        changed = self.state.planning_round is not None and self._resend_plan()
        for step in self._running_workers():
            changed = self._resend_step(step.index) or changed
        return changed

    def _resend_plan(self) -> bool:
        """Mark the plan request to be sent again by the next ``advance``; whether it was not
        marked already."""
        changed = not self.state.resend_plan
        self.state.resend_plan = True
        return changed

    def _resend_step(self, index: int) -> bool:
        """Mark a running step to be sent again by the next ``advance``; whether it was not
        marked already."""
        if index in self.state.resend_steps:
            return False
        self.state.resend_steps.append(index)
        return True

    def _sent_at(self, step: StepRecord) -> datetime:
        """When a running step was last sent (every dispatch records it)."""
        return self.state.dispatched_at.get(step.index) or step.started_at or utcnow()

    def _running_workers(self) -> list[StepRecord]:
        return [
            s
            for s in self.result.steps
            if s.kind is StepKind.WORKER and s.status is StepStatus.RUNNING
        ]

    # -- transitions ------------------------------------------------------------------------

    def _plan_ready(self, round_no: int, outcome: PlanOutcome) -> bool:
        if self.state.finished or self.state.planning_round != round_no:
            return False
        self.state.planning_round = None
        outcome = outcome.model_copy(update={"round": round_no})
        self.result.planner_calls.append(outcome)
        self._emit(EventKind.PLAN, round=round_no)
        conductor = self._conductor_step(round_no)
        if conductor is not None:
            conductor.status = StepStatus.SUCCEEDED
            conductor.latency_ms = outcome.latency_ms
            conductor.output = _replan_summary(outcome)
            self._mark_finished(conductor)
        if outcome.stop:
            return True
        offset = len(self.result.steps)
        for local_index, step in enumerate(outcome.plan.steps):
            entry = outcome.worker_of(step)
            index = offset + local_index
            self.result.steps.append(
                StepRecord(
                    index=index,
                    round=round_no,
                    kind=StepKind.CONDUCTOR if entry.is_conductor else StepKind.WORKER,
                    worker=entry.name,
                    subtask=step.subtask,
                    access_list=list(step.access_list),
                    visible_steps=resolve_visible_steps(
                        step.access_list, index, offset, self.result.steps
                    ),
                )
            )
        self._answer_on_a_tool_worker(round_no)
        return True

    def _answer_on_a_tool_worker(self, round_no: int) -> None:
        """While tools are offered, the round's answering step runs on a worker whose wire
        format carries them: the pool's first such worker when the plan chose another (the
        plan keeps its choice; the step records the worker that ran)."""
        if self.state.tools is None:
            return
        workers = [s for s in self.result.steps if s.round == round_no]
        workers = [s for s in workers if s.kind is StepKind.WORKER]
        if workers and workers[-1].worker not in self.state.tool_workers:
            workers[-1].worker = self.state.tool_workers[0]

    def _plan_failed(self, round_no: int, error: str) -> bool:
        if self.state.finished or self.state.planning_round != round_no:
            return False
        self.state.planning_round = None
        conductor = self._conductor_step(round_no)
        if conductor is None:
            self._fail(f"the Conductor failed to plan: {error}")
            return True
        # The earlier round's answer stands; the failed review is recorded on its step.
        conductor.status, conductor.error = StepStatus.FAILED, error
        self._mark_finished(conductor)
        self._complete()
        return True

    def _step_succeeded(self, index: int, call: StepCallResult) -> bool:
        step = self._running(index)
        if step is None:
            return False
        step.attempts = call.attempts
        step.output, step.usage, step.cost_usd = call.text, call.usage, call.cost_usd
        step.tool_calls = list(call.tool_calls)
        step.status = StepStatus.SUCCEEDED
        self._mark_finished(step)
        return True

    def _step_failed(self, index: int, error: str, attempts: list[AttemptRecord]) -> bool:
        step = self._running(index)
        if step is None:
            return False
        step.attempts = attempts
        step.usage, step.cost_usd = attempts_total(attempts)
        step.status, step.error = StepStatus.FAILED, error
        self._mark_finished(step)
        self._fail(f"step {step.index} ({step.worker}) failed: {error}")
        return True

    def _late_attempts(self, index: int, attempts: Sequence[AttemptRecord]) -> bool:
        """The calls of a step that its workflow's end cancelled, reported after that end: the
        trace keeps them and the totals count them (a step's first report of them stands)."""
        step = self._step(index)
        if step is None or step.status is not StepStatus.CANCELLED or step.attempts:
            return False
        if not attempts:
            return False
        step.attempts = list(attempts)
        step.usage, step.cost_usd = attempts_total(step.attempts)
        self._add_up()
        self._emit(EventKind.ATTEMPTS, step=index)
        return True

    def _fail(self, reason: str) -> bool:
        """End the workflow without an answer; steps still pending or running are cancelled."""
        if self.state.finished:
            return False
        self.result.status, self.result.error = WorkflowStatus.FAILED, reason
        self._end(EventKind.FAILED)
        return True

    def _cancel(self, reason: str) -> bool:
        if self.state.finished:
            return False
        self.result.status, self.result.error = WorkflowStatus.CANCELLED, reason
        self._end(EventKind.CANCELLED)
        return True

    def _streams(self, step: StepRecord) -> bool:
        """Whether the answering ``step``'s text goes to the client as its worker writes it:
        only when that text is the workflow's answer as written, known before it ends. Not
        with a required form (the answer is the JSON taken out of the text), nor with tools
        (it may be calls), nor in a round the Conductor reviews (a later round may replace
        it)."""
        state = self.state
        if not state.stream_answer or state.answer_format is not None or state.tools is not None:
            return False
        same_round = (s for s in self.result.steps if s.round == step.round)
        return not any(s.kind is StepKind.CONDUCTOR for s in same_round)

    def _writes_the_answer(self, step: StepRecord) -> bool:
        """Whether ``step`` is its round's last worker step: the one whose answer stands."""
        return step.index == max(
            s.index
            for s in self.result.steps
            if s.round == step.round and s.kind is StepKind.WORKER
        )

    def _complete(self) -> None:
        worker_steps = [s for s in self.result.steps if s.kind is StepKind.WORKER]
        if not worker_steps:
            self._fail("no step produced an answer")
            return
        # The last step's answer is the answer, even when it is empty.
        final = worker_steps[-1]
        answer = final.output or ""
        if self.state.tools is not None:
            refusal = forced_call_error(self.state.tools, final.tool_calls)
            if refusal is not None:
                self._fail(refusal)
                return
        if self.state.answer_format is not None and not final.tool_calls:
            try:
                answer = self.state.answer_format.conform(answer)
            except AnswerFormatError as exc:
                self._fail(f"the answer does not follow response_format: {exc}")
                return
        self.result.answer = answer
        self.result.status = WorkflowStatus.COMPLETED
        self._end(EventKind.COMPLETED)

    def _end(self, kind: EventKind) -> None:
        self.state.planning_round = None
        for step in self.result.steps:
            if step.status.active:
                step.status = StepStatus.CANCELLED
                self._mark_finished(step)
        self._add_up()
        self.result.finished_at = utcnow()
        self.result.latency_ms = _ms(self.result.finished_at - self.result.created_at)
        self._emit(kind)

    # -- helpers ----------------------------------------------------------------------------

    def _add_up(self) -> None:
        """The workflow's usage and cost: its planner calls' and its steps'."""
        usage, cost = Usage(), 0.0
        for call in self.result.planner_calls:
            usage, cost = usage + call.usage, cost + call.cost_usd
        for step in self.result.steps:
            usage, cost = usage + step.usage, cost + step.cost_usd
        self.result.usage, self.result.cost_usd = usage, cost

    def _step(self, index: int) -> StepRecord | None:
        steps = self.result.steps
        return steps[index] if 0 <= index < len(steps) else None

    def _running(self, index: int) -> StepRecord | None:
        step = self._step(index)
        if self.state.finished or step is None or step.status is not StepStatus.RUNNING:
            return None  # a duplicate or late answer: the first one counted
        return step

    def _conductor_step(self, round_no: int) -> StepRecord | None:
        """The Conductor step whose execution is the plan of ``round_no`` (None in round 0)."""
        for step in self.result.steps:
            if step.round == round_no - 1 and step.kind is StepKind.CONDUCTOR:
                return step
        return None

    def _mark_started(self, step: StepRecord) -> None:
        step.status, step.started_at = StepStatus.RUNNING, utcnow()
        self._emit(EventKind.STEP_STARTED, step=step.index)

    def _mark_finished(self, step: StepRecord) -> None:
        step.finished_at = utcnow()
        if step.started_at is not None and step.kind is StepKind.WORKER:
            step.latency_ms = _ms(step.finished_at - step.started_at)
        self._emit(EventKind.STEP_FINISHED, step=step.index)

    def _emit(
        self,
        kind: EventKind,
        *,
        step: int | None = None,
        round: int | None = None,
        workers: list[str] | None = None,
    ) -> None:
        # Clients number the events they stream from 1; "started" and "attempts" are for
        # traces only (sequence 0).
        streamed = kind not in (EventKind.STARTED, EventKind.ATTEMPTS)
        if streamed:
            self.state.event_sequence += 1
        sequence = self.state.event_sequence if streamed else 0
        self.events.append(
            MachineEvent(
                kind=kind, sequence=sequence, at=utcnow(), step=step, round=round, workers=workers
            )
        )


def event_subject(
    result: WorkflowRecord, event: MachineEvent
) -> PlanOutcome | StepRecord | WorkflowRecord:
    """What an event is about: the plan of its round, its step, or the whole workflow."""
    if event.kind is EventKind.PLAN:
        return next(c for c in result.planner_calls if c.round == event.round)
    if event.kind in (EventKind.STEP_STARTED, EventKind.STEP_FINISHED, EventKind.ATTEMPTS):
        assert event.step is not None
        return result.steps[event.step]
    return result


def event_row(result: WorkflowRecord, event: MachineEvent) -> dict[str, Any]:
    """A numbered event as the ``workflow_event`` table keeps it (what clients stream)."""
    return {
        "sequence": event.sequence,
        "kind": event.kind.value,
        "at": event.at,
        "payload": event_subject(result, event).model_dump(mode="json"),
    }


def _ms(delta: Any) -> float:
    return float(delta.total_seconds() * 1000)


def _replan_summary(outcome: PlanOutcome) -> str:
    if not outcome.valid:
        return "invalid re-plan; the last answer stands: " + "; ".join(outcome.errors)
    if outcome.stop:
        return "the Conductor stopped; the last answer stands"
    return f"the Conductor wrote {len(outcome.plan.steps)} more step(s)"


def forced_call_error(tools: ToolUse, calls: Sequence[ToolCall]) -> str | None:
    """Why an answer breaks a forced function call (``tool_choice`` naming a function, or
    "required"), or None: the function must be called, with arguments that follow its
    parameters' JSON Schema."""
    if tools.choice in ("auto", "none"):
        return None
    if not calls:
        return f"tool_choice {tools.choice!r}: the answering worker called no function"
    specs = {t.name: t for t in tools.tools}
    for call in calls:
        if tools.choice != "required" and call.name != tools.choice:
            return f"tool_choice {tools.choice!r}: the answering worker called {call.name!r}"
        spec = specs.get(call.name)
        if spec is None:
            return f"the answering worker called {call.name!r}, which was not offered"
        schema = spec.parameters or {"type": "object"}
        try:
            AnswerFormat(type="json_schema", json_schema=schema).conform(call.arguments)
        except AnswerFormatError as exc:
            return f"the arguments of the call of {call.name!r} do not follow its parameters: {exc}"
    return None
