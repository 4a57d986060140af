"""Runs workflows in-process: the embedded driver of the workflow state machine.

The machine (conductor.machine) decides; this driver performs its actions as asyncio tasks, so
every step whose access list is satisfied runs at once and independent steps overlap in time.
Observers see each event as it happens; the trace store and the CLI are observers.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from conductor.errors import ConfigurationError, InvalidRequest
from conductor.machine import (
    Action,
    Dispatch,
    EventKind,
    MachineEvent,
    RequestPlan,
    WorkflowMachine,
    event_subject,
)
from conductor.orchestration import check_question
from conductor.pool import Pool
from conductor.ports import (
    EventObserver,
    Planner,
    StepCallFailed,
    StepRunner,
    WorkflowObserver,
)
from conductor.profiles import Profile
from conductor.workflow import PlanOutcome, PoolEntry, StepRecord, WorkflowResult

logger = logging.getLogger(__name__)


def step_error(exc: BaseException) -> str:
    """How a failed step call is recorded: the error class and its message."""
    return f"{type(exc).__name__}: {exc}"


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
        self,
        question: str,
        profile: Profile,
        *,
        workflow_id: uuid.UUID | None = None,
        pool: Sequence[str] | None = None,
        created_at: datetime | None = None,
    ) -> WorkflowResult:
        """Run one workflow; ``pool`` limits the workers the Conductor sees (None: all)."""
        check_question(question)
        entries = self.entries_for(pool)
        if not entries:
            raise ConfigurationError("no worker in the pool can be called")
        machine = WorkflowMachine.start(
            workflow_id=workflow_id or uuid.uuid4(),
            question=question,
            profile=profile,
            entries=entries,
            created_at=created_at,
        )
        tasks: set[asyncio.Task[Callable[[], object]]] = set()
        try:
            await self._deliver(machine)
            async with asyncio.timeout(profile.workflow_timeout_s):
                while True:
                    for action in machine.advance():
                        tasks.add(asyncio.create_task(self._perform(machine, action)))
                    await self._deliver(machine)
                    if not tasks:
                        break
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        tasks.discard(task)
                        task.result()()  # apply the outcome to the machine
                    await self._deliver(machine)
        except TimeoutError:
            machine.fail(
                f"no answer within the workflow deadline of {profile.workflow_timeout_s:g} s"
            )
        except asyncio.CancelledError:
            machine.fail("cancelled before it finished")
            raise
        except Exception as exc:  # recorded, never lost: the trace says what went wrong
            machine.fail(f"internal error: {type(exc).__name__}: {exc}")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._deliver(machine)
        return machine.result

    def entries_for(self, names: Sequence[str] | None) -> list[PoolEntry]:
        """The callable workers among ``names``, in pool order; unknown names are refused."""
        if names is None:
            return list(self.entries)
        unknown = sorted(set(names) - {e.name for e in self.entries})
        if unknown:
            raise InvalidRequest(f"workers not in the pool: {', '.join(unknown)}")
        return [e for e in self.entries if e.name in set(names)]

    async def _perform(self, machine: WorkflowMachine, action: Action) -> Callable[[], object]:
        """Run one action; returns how to apply its outcome (applied on the driver's turn)."""
        profile = machine.state.profile
        if isinstance(action, RequestPlan):
            try:
                outcome = await self.planner.plan(action.request)
            except Exception as exc:
                error = str(exc)
                return lambda: machine.plan_failed(action.round, error)
            return lambda: machine.plan_ready(action.round, outcome)
        assert isinstance(action, Dispatch)
        try:
            async with asyncio.timeout(profile.step_timeout_s):
                call = await self.gateway.call(action.worker, action.messages)
        except TimeoutError:
            error = f"no answer within {profile.step_timeout_s:g} s"
            return lambda: machine.step_failed(action.step, error, [])
        except Exception as exc:
            attempts = exc.attempts if isinstance(exc, StepCallFailed) else []
            error = step_error(exc)
            return lambda: machine.step_failed(action.step, error, attempts)
        return lambda: machine.step_succeeded(action.step, call)

    async def _deliver(self, machine: WorkflowMachine) -> None:
        """Tell the observers what the machine recorded since the last delivery."""
        result = machine.result
        events = machine.take_events()
        for event in events:
            notify = self._observer_call(result, event)
            for observer in self.observers:
                await self._tell(observer, notify(observer))
        for observer in self.observers:
            if events and isinstance(observer, EventObserver):
                await self._tell(observer, observer.events_recorded(result, events))

    @staticmethod
    async def _tell(observer: object, call: Awaitable[None]) -> None:
        try:
            await call
        except Exception:
            # One failing observer is logged and skipped: the workflow and the others carry
            # on (an unreachable trace database must not lose the answer).
            logger.exception("observer %s failed; continuing", type(observer).__name__)

    def _observer_call(
        self, result: WorkflowResult, event: MachineEvent
    ) -> Callable[[WorkflowObserver], Awaitable[None]]:
        subject = event_subject(result, event)
        if event.kind is EventKind.STARTED:
            snapshot = [self.pool.get(e.name).snapshot() for e in self.entries]
            return lambda o: o.workflow_started(result, snapshot)
        if isinstance(subject, PlanOutcome):
            return lambda o: o.plan_ready(result, subject)
        if isinstance(subject, StepRecord):
            if event.kind is EventKind.STEP_STARTED:
                return lambda o: o.step_started(result, subject)
            return lambda o: o.step_finished(result, subject)
        return lambda o: o.workflow_finished(result)


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
