"""Runs an evaluation: every (item, strategy) as a workflow on one executor set-up and pool.

Jobs run with bounded concurrency; each result is verified (an outcome table's question: by
the recorded score of the worker whose answer is final), written to the result store at once
(so an interrupted run resumes where it stopped) and reported to a progress callback. A job
that fails in the harness is recorded as wrong with its error; the run carries on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from conductor.executor import WorkflowExecutor
from conductor.pool import Pool
from conductor.ports import Planner, PlannerBackend, StepRunner
from conductor.variants import Variant
from conductor.workflow import StepKind, WorkflowRecord, WorkflowStatus
from conductor_evaluation.items import AnswerKind, EvalItem, Verdict
from conductor_evaluation.replay import replay_verdict, unrecorded_workers
from conductor_evaluation.results import ANSWER_CHARS, UNRECORDED, ItemResult, ResultStore
from conductor_evaluation.sim import evaluating
from conductor_evaluation.strategies import FixedPlanner, Kind, Strategy, fixed_variant
from conductor_evaluation.verify import verify

logger = logging.getLogger(__name__)

Job = tuple[EvalItem, Strategy]


@dataclass
class EvalRuntime:
    """The pool's gateway, shared by every strategy, and the Conductor's planner if needed."""

    pool: Pool
    gateway: StepRunner
    planner: Planner | None = None
    backend: PlannerBackend | None = None  # the planner's model, closed with the runtime
    step_timeout_s: float = 300.0
    _executors: dict[str, tuple[WorkflowExecutor, Variant]] = field(default_factory=dict)

    async def aclose(self) -> None:
        await self.gateway.aclose()
        if self.backend is not None:
            await self.backend.aclose()

    def executor_for(self, strategy: Strategy) -> tuple[WorkflowExecutor, Variant]:
        if strategy.name not in self._executors:
            if strategy.kind is Kind.CONDUCTOR:
                if self.planner is None or strategy.variant is None:
                    raise ValueError(f"{strategy.name} needs the Conductor's planner")
                planner: Planner = self.planner
                variant = strategy.variant.model_copy(
                    update={
                        "step_timeout_s": min(strategy.variant.step_timeout_s, self.step_timeout_s)
                    }
                )
            else:
                planner = FixedPlanner(strategy)
                variant = fixed_variant(strategy, step_timeout_s=self.step_timeout_s)
            executor = WorkflowExecutor(planner=planner, pool=self.pool, gateway=self.gateway)
            self._executors[strategy.name] = (executor, variant)
        return self._executors[strategy.name]


def pending_jobs(
    suites: dict[str, list[EvalItem]],
    strategies: Sequence[Strategy],
    done: dict[tuple[str, str, str], ItemResult],
) -> list[Job]:
    """Item-major order: an interrupted run has every strategy on its first items."""
    return [
        (item, strategy)
        for items in suites.values()
        for item in items
        for strategy in strategies
        if strategy.runs and (item.suite, item.id, strategy.name) not in done
    ]


async def run_jobs(
    jobs: Sequence[Job],
    runtime: EvalRuntime,
    store: ResultStore,
    *,
    seed: int,
    concurrency: int,
    on_result: Callable[[ItemResult], None] = lambda r: None,
) -> list[ItemResult]:
    gate = asyncio.Semaphore(concurrency)

    async def one(item: EvalItem, strategy: Strategy) -> ItemResult:
        async with gate:
            try:
                result = await run_one(item, strategy, runtime, seed=seed)
            except Exception as exc:
                logger.exception("%s on %s failed in the harness", strategy.name, item.key)
                result = ItemResult(
                    suite=item.suite,
                    item_id=item.id,
                    strategy=strategy.name,
                    correct=False,
                    status="error",
                    detail=f"{type(exc).__name__}: {exc}",
                    reference=item.answer[:ANSWER_CHARS],
                )
            store.append(result)
            on_result(result)
            return result

    return list(await asyncio.gather(*(one(item, strategy) for item, strategy in jobs)))


async def judge(item: EvalItem, workflow: WorkflowRecord, pool: Pool) -> Verdict:
    """A completed workflow's verdict: a table's question by the recorded score of the worker
    whose answer is final (no verifier can read a replayed answer), any other by its suite's
    verifier. Evaluation and training judge alike through it."""
    if item.kind is AnswerKind.REPLAY:
        return replay_verdict(item, workflow, pool)
    return await verify(item, workflow.answer)


async def run_one(
    item: EvalItem, strategy: Strategy, runtime: EvalRuntime, *, seed: int
) -> ItemResult:
    executor, variant = runtime.executor_for(strategy)
    status: str | None = None
    with evaluating(item, seed):
        workflow = await executor.run(item.question, variant)
        if workflow.status is WorkflowStatus.COMPLETED:
            verdict = await judge(item, workflow, runtime.pool)
        else:
            verdict = Verdict(correct=False, detail=workflow.error or "the workflow failed")
            if item.kind is AnswerKind.REPLAY:
                missing = unrecorded_workers(item, workflow, runtime.pool)
                if missing:
                    status = UNRECORDED
                    verdict = Verdict(
                        correct=False,
                        detail=f"not recorded on this question: {', '.join(missing)}",
                    )
    return item_result(item, strategy, workflow, verdict, status=status)


def item_result(
    item: EvalItem,
    strategy: Strategy,
    workflow: WorkflowRecord,
    verdict: Verdict,
    *,
    status: str | None = None,
) -> ItemResult:
    """``status`` overrides the workflow's (UNRECORDED)."""
    worker_steps = [s for s in workflow.steps if s.kind is StepKind.WORKER]
    return ItemResult(
        suite=item.suite,
        item_id=item.id,
        strategy=strategy.name,
        correct=verdict.correct,
        status=status or workflow.status.value,
        score=verdict.score,
        extracted=None if verdict.extracted is None else verdict.extracted[:ANSWER_CHARS],
        detail=verdict.detail,
        answer=None if workflow.answer is None else workflow.answer[:ANSWER_CHARS],
        reference=item.answer[:ANSWER_CHARS],
        plan_valid=workflow.plan_valid if strategy.kind is Kind.CONDUCTOR else None,
        steps=len(worker_steps),
        workers=[s.worker for s in worker_steps],
        sees=[list(s.visible_steps) for s in worker_steps],
        prompt_tokens=workflow.usage.prompt_tokens,
        completion_tokens=workflow.usage.completion_tokens,
        cost_usd=workflow.cost_usd,
        latency_ms=workflow.latency_ms,
        workflow_id=str(workflow.workflow_id),
    )
