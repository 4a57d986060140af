"""Runs workflows in-process: the embedded driver of the workflow state machine.

The machine (conductor.machine) decides; this driver performs its actions as asyncio tasks, so
every step whose access list is satisfied runs at once and independent steps overlap in time,
and applies what each task returns as a fact. Observers see the events as they happen; the
trace store, the CLI's live view and the API's event announcements are observers.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from conductor.answer_format import AnswerFormat
from conductor.chat import ToolUse
from conductor.errors import ConfigurationError, InvalidRequest, StepCallFailed
from conductor.machine import (
    Aborted,
    Action,
    Cancelled,
    Dispatch,
    Fact,
    PlanFailed,
    PlanReady,
    RequestPlan,
    StepFailed,
    StepSucceeded,
    WorkflowMachine,
)
from conductor.orchestration import check_question
from conductor.pool import Pool
from conductor.ports import AnswerStreams, DeltaSink, Planner, StepRunner, WorkflowObserver
from conductor.tracing import end_step, end_workflow, planning_span, step_span, workflow_span
from conductor.variants import Variant
from conductor.workflow import AttemptRecord, PoolEntry, WorkflowRecord

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
        answer_streams: AnswerStreams | None = None,
    ) -> None:
        callable_names = gateway.worker_names
        missing = sorted(callable_names - {w.name for w in pool.workers})
        if missing:
            raise ConfigurationError(f"workers not in the pool: {', '.join(missing)}")
        self.planner = planner
        self.pool = pool
        self.gateway = gateway
        self.observers = list(observers)
        # Where a streamed answering step's text goes as it is written (None: nowhere).
        self.answer_streams = answer_streams
        # The Conductor sees the callable workers, in pool order, as Model 0..N-1.
        self.entries = [
            PoolEntry(name=w.name, description=w.description)
            for w in pool.workers
            if w.name in callable_names
        ]

    async def run(
        self,
        question: str,
        variant: Variant,
        *,
        workflow_id: uuid.UUID | None = None,
        pool: Sequence[str] | None = None,
        created_at: datetime | None = None,
        answer_format: AnswerFormat | None = None,
        tenant: str | None = None,
        tools: ToolUse | None = None,
        stream_answer: bool = False,
        trace_parent: str | None = None,
    ) -> WorkflowRecord:
        """Run one workflow; ``pool`` limits the workers the Conductor sees (None: all);
        ``answer_format`` is the form its answer must take (None: any text); ``tenant`` is
        whose workflow it is (its calls take a fair turn on busy workers); ``tools`` are the
        client's functions, offered to the step that writes the answer; ``stream_answer``:
        that step's text goes to ``answer_streams`` as it is written, where it is the answer;
        ``trace_parent``: the W3C traceparent its span belongs under when it does not run under
        its request's (a queued job's)."""
        workflow_id = workflow_id or uuid.uuid4()
        with workflow_span(workflow_id, variant.name, tenant, trace_parent) as span:
            record = await self._run(
                question,
                variant,
                workflow_id=workflow_id,
                pool=pool,
                created_at=created_at,
                answer_format=answer_format,
                tenant=tenant,
                tools=tools,
                stream_answer=stream_answer,
            )
            if span is not None:
                end_workflow(span, record)
            return record

    async def _run(
        self,
        question: str,
        variant: Variant,
        *,
        workflow_id: uuid.UUID,
        pool: Sequence[str] | None,
        created_at: datetime | None,
        answer_format: AnswerFormat | None,
        tenant: str | None,
        tools: ToolUse | None,
        stream_answer: bool,
    ) -> WorkflowRecord:
        check_question(question)
        entries = self.entries_for(pool)
        if not entries:
            raise ConfigurationError("no worker in the pool can be called")
        machine = WorkflowMachine.start(
            workflow_id=workflow_id,
            question=question,
            variant=variant,
            entries=entries,
            created_at=created_at,
            answer_format=answer_format,
            tenant=tenant,
            tools=tools,
            tool_workers=self.pool.tool_workers,
            stream_answer=stream_answer and self.answer_streams is not None,
        )
        tasks: set[asyncio.Task[Fact]] = set()
        late: list[Fact] = []  # the calls of steps cancelled with the workflow (see _perform)
        try:
            await self._deliver(machine)
            async with asyncio.timeout(variant.workflow_timeout_s):
                while True:
                    for action in machine.advance():
                        tasks.add(asyncio.create_task(self._perform(machine, action, late)))
                    await self._deliver(machine)
                    if not tasks or machine.state.finished:
                        break  # an ended workflow waits for nothing: the rest is cancelled
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        tasks.discard(task)
                        machine.apply(task.result())
                    await self._deliver(machine)
        except TimeoutError:
            reason = f"no answer within the workflow deadline of {variant.workflow_timeout_s:g} s"
            machine.apply(Aborted(reason))
        except asyncio.CancelledError as exc:
            # task.cancel(Cancelled(reason)) is its client's cancel; any other, the process's.
            cancel = next((a for a in exc.args if isinstance(a, Cancelled)), None)
            machine.apply(cancel or Aborted("cancelled before it finished"))
            raise
        except Exception as exc:  # recorded, never lost: the trace says what went wrong
            machine.apply(Aborted(f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for fact in late:
                machine.apply(fact)
            await self._deliver(machine)
        return machine.result

    def entries_for(self, names: Sequence[str] | None) -> list[PoolEntry]:
        """The callable workers among ``names``, in pool order; unknown names are refused."""
        if names is None:
            return list(self.entries)
        unknown = sorted(set(names) - {e.name for e in self.entries})
        if unknown:
            raise InvalidRequest(f"workers not in the pool: {', '.join(unknown)}")
        wanted = set(names)
        return [e for e in self.entries if e.name in wanted]

    async def _perform(self, machine: WorkflowMachine, action: Action, late: list[Fact]) -> Fact:
        """Run one action; returns what happened, applied on the driver's turn. A step call
        cancelled with its workflow adds the calls it made to ``late``: each may be billed."""
        if isinstance(action, RequestPlan):
            with planning_span(action.round):
                try:
                    return PlanReady(action.round, await self.planner.plan(action.request))
                except Exception as exc:
                    return PlanFailed(action.round, str(exc))
        with step_span(action.step, action.worker) as span:
            fact = await self._call_step(machine, action, late)
            if isinstance(fact, StepSucceeded):
                end_step(span, fact.call.cost_usd, None)
            elif isinstance(fact, StepFailed):
                end_step(span, None, fact.error)
            return fact

    async def _call_step(
        self, machine: WorkflowMachine, action: Dispatch, late: list[Fact]
    ) -> Fact:
        variant = machine.state.variant
        made: list[AttemptRecord] = []  # filled by the gateway as it calls
        try:
            async with asyncio.timeout(variant.step_timeout_s):
                call = await self.gateway.call(
                    action.worker,
                    action.messages,
                    allowed_workers=action.allowed_workers,
                    tenant=action.tenant,
                    tools=action.tools,
                    attempts=made,
                    answer_format=action.answer_format,
                    deltas=self._sink(machine, action),
                )
        except TimeoutError:
            error = f"no answer within {variant.step_timeout_s:g} s"
            return StepFailed(action.step, error, tuple(made))
        except asyncio.CancelledError:
            if made:
                late.append(StepFailed(action.step, "cancelled with its workflow", tuple(made)))
            raise
        except Exception as exc:
            attempts = tuple(exc.attempts) if isinstance(exc, StepCallFailed) else tuple(made)
            return StepFailed(action.step, step_error(exc), attempts)
        return StepSucceeded(action.step, call)

    def _sink(self, machine: WorkflowMachine, action: Dispatch) -> DeltaSink | None:
        if not action.streams or self.answer_streams is None:
            return None
        return self.answer_streams.sink(machine.result.workflow_id, action.step)

    async def _deliver(self, machine: WorkflowMachine) -> None:
        """Tell the observers what the machine recorded since the last delivery, in order."""
        events = machine.take_events()
        if not events:
            return
        for observer in self.observers:
            try:
                await observer.observe(machine.result, events)
            except Exception:
                # One failing observer is logged and skipped: the workflow and the others carry
                # on (an unreachable trace database must not lose the answer).
                logger.exception("observer %s failed; continuing", type(observer).__name__)
