"""Runs workflows in-process: plan, execute the plan as a graph, recurse, finish.

Every step whose access list is satisfied starts at once, so independent steps overlap in time.
A plan whose last step names the Conductor triggers one more planning round (bounded by the
profile's recursion rounds and by fewer than twice the first plan's calls). Observers see each
event as it happens; the trace store and the CLI are observers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from conductor.chat import Usage
from conductor.errors import ConfigurationError, InvalidRequest
from conductor.orchestration import (
    CONDUCTOR_WORKER,
    build_messages,
    recursion_budget,
    resolve_visible_steps,
    round_limits,
)
from conductor.pool import Pool
from conductor.ports import (
    Planner,
    PlanRequest,
    PriorRound,
    StepCallFailed,
    StepRunner,
    WorkflowObserver,
)
from conductor.profiles import Profile
from conductor.workflow import (
    PlanOutcome,
    PoolEntry,
    StepKind,
    StepRecord,
    StepStatus,
    WorkflowResult,
    WorkflowStatus,
    attempts_total,
)

logger = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 100_000
CONDUCTOR_ENTRY = PoolEntry(name=CONDUCTOR_WORKER, description="the Conductor", is_conductor=True)


class WorkflowFailed(Exception):
    """Ends a workflow in the failed state with a reason users can read."""


def check_question(question: str) -> None:
    if not question.strip():
        raise InvalidRequest("the question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise InvalidRequest(f"the question is longer than {MAX_QUESTION_CHARS} characters")


def _now() -> datetime:
    return datetime.now(UTC)


class WorkflowExecutor:
    def __init__(
        self,
        *,
        planner: Planner,
        pool: Pool,
        gateway: StepRunner,
        observers: Sequence[WorkflowObserver] = (),
    ) -> None:
        callable_names = gateway.worker_names
        missing = sorted(callable_names - {w.name for w in pool.workers})
        if missing:
            raise ConfigurationError(f"workers not in the pool: {', '.join(missing)}")
        self.planner = planner
        self.pool = pool
        self.gateway = gateway
        self.observers = list(observers)
        # The Conductor sees the callable workers, in pool order, as Model 0..N-1.
        self.entries = [
            PoolEntry(name=w.name, description=w.description)
            for w in pool.workers
            if w.name in callable_names
        ]

    async def run(
        self, question: str, profile: Profile, *, workflow_id: uuid.UUID | None = None
    ) -> WorkflowResult:
        check_question(question)
        if not self.entries:
            raise ConfigurationError("no worker in the pool can be called")
        result = WorkflowResult(
            workflow_id=workflow_id or uuid.uuid4(),
            variant=profile.name,
            question=question,
            status=WorkflowStatus.RUNNING,
            planner_calls=[],
            steps=[],
            created_at=_now(),
        )
        started = time.perf_counter()
        snapshot = [self.pool.get(e.name).snapshot() for e in self.entries]
        await self._notify(lambda o: o.workflow_started(result, snapshot))
        try:
            await self._orchestrate(result, profile)
            worker_steps = [s for s in result.steps if s.kind is StepKind.WORKER]
            if not worker_steps:
                raise WorkflowFailed("no step produced an answer")
            # The last step's answer is the answer, even when it is empty.
            result.answer = worker_steps[-1].output or ""
            result.status = WorkflowStatus.COMPLETED
        except WorkflowFailed as exc:
            result.status, result.error = WorkflowStatus.FAILED, str(exc)
        except asyncio.CancelledError:
            result.status, result.error = WorkflowStatus.FAILED, "cancelled before it finished"
            raise
        except Exception as exc:  # recorded, never lost: the trace says what went wrong
            result.status = WorkflowStatus.FAILED
            result.error = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            # Every step ends in a terminal state: those a failure or cancellation left
            # pending or running (a Conductor step included) are recorded as cancelled.
            for step in result.steps:
                if step.status in (StepStatus.PENDING, StepStatus.RUNNING):
                    step.status = StepStatus.CANCELLED
                    await self._mark_finished(result, step)
            self._finish_totals(result, started)
            await self._notify(lambda o: o.workflow_finished(result))
        return result

    async def _notify(self, event: Callable[[WorkflowObserver], Awaitable[None]]) -> None:
        """Tell every observer. One that fails is logged and skipped: the workflow and the
        other observers carry on (an unreachable trace database must not lose the answer)."""
        for observer in self.observers:
            try:
                await event(observer)
            except Exception:
                logger.exception("observer %s failed; continuing", type(observer).__name__)

    async def _orchestrate(self, result: WorkflowResult, profile: Profile) -> None:
        round_no = 0
        prior: PriorRound | None = None
        steps_left: int | None = None
        conductor_step: StepRecord | None = None
        while True:
            max_steps, offer = round_limits(
                profile_max_steps=profile.max_steps,
                rounds_left=profile.recursion_rounds - round_no,
                steps_left=steps_left,
            )
            if max_steps < 1:
                return
            request = PlanRequest(
                question=result.question,
                pool=[*self.entries, CONDUCTOR_ENTRY] if offer else list(self.entries),
                max_steps=max_steps,
                round=round_no,
                prior=prior,
                temperature=profile.planner_temperature,
                max_tokens=profile.planner_max_tokens,
            )
            outcome = await self._plan(result, request, conductor_step)
            if outcome is None or outcome.stop:
                return
            if steps_left is None:
                steps_left = recursion_budget(len(outcome.plan.steps))
            records = self._add_records(result, outcome)
            steps_left -= len(records)
            await self._run_round(
                result, [r for r in records if r.kind is StepKind.WORKER], profile
            )
            if records[-1].kind is not StepKind.CONDUCTOR:
                return
            conductor_step = records[-1]
            prior = PriorRound(
                plan=outcome.plan,
                answers=[r.output for r in records],
                last_answer=records[-2].output or "",
            )
            round_no += 1

    async def _plan(
        self, result: WorkflowResult, request: PlanRequest, conductor_step: StepRecord | None
    ) -> PlanOutcome | None:
        """One Conductor call. In a recursion round it is the Conductor step's execution."""
        if conductor_step is not None:
            await self._mark_started(result, conductor_step)
        try:
            outcome = await self.planner.plan(request)
        except Exception as exc:
            if conductor_step is None:
                raise WorkflowFailed(f"the Conductor failed to plan: {exc}") from exc
            # The first round's answer stands; the failed review is recorded on its step.
            conductor_step.status, conductor_step.error = StepStatus.FAILED, str(exc)
            await self._mark_finished(result, conductor_step)
            return None
        result.planner_calls.append(outcome)
        await self._notify(lambda o: o.plan_ready(result, outcome))
        if conductor_step is not None:
            conductor_step.status = StepStatus.SUCCEEDED
            conductor_step.latency_ms = outcome.latency_ms
            conductor_step.output = _replan_summary(outcome)
            await self._mark_finished(result, conductor_step)
        return outcome

    def _add_records(self, result: WorkflowResult, outcome: PlanOutcome) -> list[StepRecord]:
        offset = len(result.steps)
        records = []
        for local_index, step in enumerate(outcome.plan.steps):
            entry = outcome.worker_of(step)
            index = offset + local_index
            record = StepRecord(
                index=index,
                round=outcome.round,
                kind=StepKind.CONDUCTOR if entry.is_conductor else StepKind.WORKER,
                worker=entry.name,
                subtask=step.subtask,
                access_list=list(step.access_list),
                visible_steps=resolve_visible_steps(step.access_list, index, offset, result.steps),
            )
            result.steps.append(record)
            records.append(record)
        return records

    async def _run_round(
        self, result: WorkflowResult, records: list[StepRecord], profile: Profile
    ) -> None:
        """Runs a round's worker steps; on a failure the others are cancelled (and recorded as
        such by ``run``)."""
        finished = {r.index: asyncio.Event() for r in records}
        by_index = {s.index: s for s in result.steps}
        if not profile.parallel:
            for record in records:
                await self._run_step(result, record, finished, by_index)
            return
        tasks = [
            asyncio.create_task(self._run_step(result, r, finished, by_index)) for r in records
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_step(
        self,
        result: WorkflowResult,
        record: StepRecord,
        finished: dict[int, asyncio.Event],
        by_index: dict[int, StepRecord],
    ) -> None:
        for index in record.visible_steps:
            if index in finished:
                await finished[index].wait()
        messages = build_messages(result.question, record, by_index)
        await self._mark_started(result, record)
        clock = time.perf_counter()
        try:
            call = await self.gateway.call(record.worker, messages)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempts = exc.attempts if isinstance(exc, StepCallFailed) else []
            record.latency_ms = (time.perf_counter() - clock) * 1000
            record.attempts = attempts
            record.usage, record.cost_usd = attempts_total(attempts)
            record.status, record.error = StepStatus.FAILED, f"{type(exc).__name__}: {exc}"
            await self._mark_finished(result, record)
            raise WorkflowFailed(
                f"step {record.index} ({record.worker}) failed: {record.error}"
            ) from exc
        record.latency_ms = (time.perf_counter() - clock) * 1000
        record.attempts = call.attempts
        record.output, record.usage, record.cost_usd = call.text, call.usage, call.cost_usd
        record.status = StepStatus.SUCCEEDED
        await self._mark_finished(result, record)
        finished[record.index].set()

    async def _mark_started(self, result: WorkflowResult, record: StepRecord) -> None:
        record.status, record.started_at = StepStatus.RUNNING, _now()
        await self._notify(lambda o: o.step_started(result, record))

    async def _mark_finished(self, result: WorkflowResult, record: StepRecord) -> None:
        record.finished_at = _now()
        await self._notify(lambda o: o.step_finished(result, record))

    @staticmethod
    def _finish_totals(result: WorkflowResult, started: float) -> None:
        usage = Usage()
        cost = 0.0
        for call in result.planner_calls:
            usage, cost = usage + call.usage, cost + call.cost_usd
        for step in result.steps:
            usage, cost = usage + step.usage, cost + step.cost_usd
        result.usage, result.cost_usd = usage, cost
        result.latency_ms = (time.perf_counter() - started) * 1000
        result.finished_at = _now()


def _replan_summary(outcome: PlanOutcome) -> str:
    if not outcome.valid:
        return "invalid re-plan; the last answer stands: " + "; ".join(outcome.errors)
    if outcome.stop:
        return "the Conductor stopped; the last answer stands"
    return f"the Conductor wrote {len(outcome.plan.steps)} more step(s)"


def workflow_summary(result: WorkflowResult) -> dict[str, Any]:
    """The machine-readable summary ``conductor ask --json`` prints."""
    return {
        "workflow_id": str(result.workflow_id),
        "variant": result.variant,
        "status": result.status.value,
        "plan_valid": result.plan_valid,
        "plan": [
            {
                "index": s.index,
                "round": s.round,
                "worker": s.worker,
                "subtask": s.subtask,
                "access_list": s.access_list,
            }
            for s in result.steps
        ],
        "planner_calls": [
            {
                "round": c.round,
                "valid": c.valid,
                "errors": c.errors,
                "stop": c.stop,
                "backend": c.backend,
                "raw_output": c.raw_output,
                "usage": c.usage.as_dict(),
                "latency_ms": round(c.latency_ms, 1),
            }
            for c in result.planner_calls
        ],
        "steps": [
            {
                "index": s.index,
                "worker": s.worker,
                "status": s.status.value,
                "output": s.output,
                "error": s.error,
                "usage": s.usage.as_dict(),
                "cost_usd": s.cost_usd,
                "latency_ms": round(s.latency_ms, 1),
                "attempts": [
                    {
                        "number": a.number,
                        "worker": a.worker,
                        "status": a.status,
                        "error_class": a.error_class,
                        "status_code": a.status_code,
                        "cost_usd": a.cost_usd,
                        "latency_ms": round(a.latency_ms, 1),
                        "quota_wait_ms": round(a.quota_wait_ms, 1),
                    }
                    for a in s.attempts
                ],
            }
            for s in result.steps
        ],
        "answer": result.answer,
        "error": result.error,
        "usage": result.usage.as_dict(),
        "cost_usd": result.cost_usd,
        "latency_ms": round(result.latency_ms, 1),
    }
