"""The GRPO reward: each sampled Conductor output is parsed, run through the real executor on
the configured pool, and the final answer verified, exactly as the method scores it:

- 0 when the three lists cannot be parsed or the plan is invalid for the pool it was shown,
- 0.5 when the plan is well-formed but the final answer is wrong (or the workflow failed),
- 1 when the final answer is right.

Rollouts of one batch run concurrently (the workers are slow I/O); simulated workers answer the
item being scored (``simulating``).

The recursion stage (``RecursionStage``) offers the Conductor itself as a worker: a sampled plan
may end by handing back to it, and the next round is planned by the policy being trained, as it
is at that moment. The method says only that the stage discounts "the first round's reward" by
0.25; since GRPO normalises rewards within a group, a discount applied to every sample alike
would change nothing, so we read it as: a workflow whose answer comes from the first round
(the plan did not recurse) earns 0.25 x its reward, one that recursed earns its final answer's
full reward. ``--first-round-discount 1`` turns the discount off.

A cost weight makes the reward cost-aware: a valid plan's reward loses ``cost_weight`` x its
workers' cost divided by the most expensive single call on its question (each worker of the
pool asked the question alone, once per question and remembered: free on simulated and replay
workers, one paid call per worker and question on live ones). Calling the dearest worker once
costs ``cost_weight``; calling it three times, three times that. It never takes a valid plan
below an invalid one's 0: a wrong plan that cost too much and a plan that could not run are
then alike, so weights above 0.5 / max steps blur that line. 0 is the method's reward.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conductor.errors import ConductorError, ConfigurationError
from conductor.executor import WorkflowExecutor
from conductor.pool import Pool
from conductor.ports import Planner, PlanRequest, PromptForm, StepRunner
from conductor.protocol import ParseFailure, fallback_plan, parse_plan, validate_plan
from conductor.variants import MAX_STEPS_LIMIT, Variant
from conductor.workflow import Plan, PlanOutcome, StepKind, StepRecord, WorkflowStatus
from conductor_evaluation import INVALID, EvalItem, given_outcome, judge, method_reward, simulating
from conductor_trainer.checkpointing import checkpointing_is_on, set_checkpointing
from conductor_trainer.metrics import (
    ACCURACY,
    FORMAT_VALID,
    PLAN_COST,
    RECURSION_RATE,
    SEES_EARLIER,
    STEPS_PER_PLAN,
    WORKER_SHARE,
)

if TYPE_CHECKING:
    from conductor_planner import ConductorPlanner


@dataclass(frozen=True)
class Rollout:
    reward: float
    valid: bool
    correct: bool
    steps: int
    errors: tuple[str, ...] = ()
    recursed: bool = False
    workers: tuple[str, ...] = ()  # of the worker steps, in order
    sees_earlier: bool = False  # a worker step saw an earlier step's output
    # Its workers' cost over the most expensive single call on its question (cost-aware
    # rewards only; 0 otherwise and for invalid plans).
    relative_cost: float = 0.0


@dataclass(frozen=True)
class RecursionStage:
    """Plans may name the Conductor; ``planner`` writes the later round (the policy itself).
    ``generation_mode`` is entered around a batch's rollouts (the policy's inference mode)."""

    planner: Planner
    first_round_discount: float = 0.25
    generation_mode: Callable[[], AbstractContextManager[None]] = nullcontext


class PolicyPlanner:
    """The Conductor planner on the model being trained, built at first use: by then the
    trainer has moved the model to its device. Its generations are not trained on (GRPO here
    trains the sampled first-round plan only)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        checkpointing_kwargs: dict[str, Any] | None = None,
        prompt_form: PromptForm = PromptForm.FULL,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.prompt_form = prompt_form
        self.checkpointing_kwargs = checkpointing_kwargs
        self._planner: ConductorPlanner | None = None

    async def plan(self, request: PlanRequest) -> PlanOutcome:
        if self._planner is None:
            from conductor_planner import ConductorPlanner, TransformersPlannerBackend

            # The backend sets its own sampling defaults on the model; the checkpoint keeps
            # the base model's (every generate call here passes its config explicitly).
            saved = self.model.generation_config
            backend = TransformersPlannerBackend(
                self.model,
                self.tokenizer,
                model_name="the policy being trained",
                prompt_form=self.prompt_form,
            )
            self.model.generation_config = saved
            self._planner = ConductorPlanner(backend)
        return await self._planner.plan(request)

    @contextmanager
    def generation_mode(self) -> Iterator[None]:
        """Inference mode while rewards are computed (the training step waits for them):
        generating in train mode with gradient checkpointing on drops the KV cache, and
        ``generate`` would then see only its last token. TRL's own sampling does the same."""
        model = self.model
        was_training = model.training
        checkpointing = checkpointing_is_on(model)
        if checkpointing:
            set_checkpointing(model, False)
        model.eval()
        try:
            yield
        finally:
            if checkpointing:
                set_checkpointing(model, True, self.checkpointing_kwargs)
            model.train(was_training)

    async def aclose(self) -> None:
        if self._planner is not None:
            await self._planner.backend.aclose()


class _GivenPlan:
    """A planner that hands the executor the plan the policy sampled, then, in a recursion
    round, asks ``later``."""

    def __init__(self, given: Plan, raw: str, later: Planner | None = None) -> None:
        self.given, self.raw, self.later = given, raw, later

    async def plan(self, request: PlanRequest) -> PlanOutcome:
        if request.round == 0:
            return given_outcome(request, self.given, raw_output=self.raw, backend="grpo-rollout")
        if self.later is None:  # the variant offers no recursion without a later planner
            raise ConductorError("a recursion round was asked for outside the recursion stage")
        return await self.later.plan(request)


class PlanRewarder:
    """Scores completions against the items and pools their prompts showed."""

    def __init__(
        self,
        pool: Pool,
        gateway: StepRunner,
        items: dict[str, EvalItem],
        *,
        max_steps: int = MAX_STEPS_LIMIT,
        step_timeout_s: float = 120.0,
        seed: int = 0,
        recursion: RecursionStage | None = None,
        planner_max_tokens: int = 1024,
        prompt_form: PromptForm = PromptForm.FULL,
        cost_weight: float = 0.0,
    ) -> None:
        if recursion is not None and max_steps < 2:
            raise ConfigurationError("the recursion stage needs plans of 2 steps or more")
        if not 0 <= cost_weight <= 1:
            raise ConfigurationError(f"--cost-weight must be between 0 and 1, not {cost_weight}")
        self.cost_weight = cost_weight
        # Per question, its most expensive single call (being) measured.
        self._dearest_call: dict[str, asyncio.Future[float]] = {}
        self.pool = pool
        self.gateway = gateway
        self.items = items
        self.max_steps = max_steps
        self.seed = seed
        self.recursion = recursion
        # Where the prompts carried the few-shot examples, a copied example subtask is invalid,
        # as the planner judges it in serving.
        self.prompt_form = prompt_form
        self.variant = Variant(
            name="grpo-rollout",
            description="a sampled plan run for its reward",
            max_steps=max_steps,
            recursion_rounds=1 if recursion else 0,
            planner_max_tokens=planner_max_tokens,
            step_timeout_s=step_timeout_s,
            # Room for a second round: fewer than twice the first plan's steps in all.
            workflow_timeout_s=step_timeout_s * max_steps * (4 if recursion else 2),
        )

    async def score(self, text: str, item_key: str, pool_names: Sequence[str]) -> Rollout:
        parsed = parse_plan(text)
        if isinstance(parsed, ParseFailure):
            return Rollout(INVALID, False, False, 0, (parsed.reason,))
        # In the recursion stage the prompt listed the Conductor after the workers.
        conductor_id = len(pool_names) if self.recursion else None
        checked = validate_plan(
            parsed,
            pool_size=len(pool_names) + (1 if self.recursion else 0),
            max_steps=self.max_steps,
            conductor_id=conductor_id,
            allow_stop=False,
            examples_shown=self.prompt_form.examples,
        )
        if checked.errors or checked.plan is None:
            return Rollout(INVALID, False, False, 0, tuple(checked.errors))
        item = self.items[item_key]
        later = self.recursion.planner if self.recursion else None
        executor = WorkflowExecutor(
            planner=_GivenPlan(checked.plan, text, later), pool=self.pool, gateway=self.gateway
        )
        seed = int.from_bytes(hashlib.sha256(f"{self.seed}\0{text}".encode()).digest()[:4], "big")
        with simulating(item, seed):
            result = await executor.run(item.question, self.variant, pool=list(pool_names))
            correct = (
                result.status is WorkflowStatus.COMPLETED
                and (await judge(item, result, self.pool)).correct
            )
        worker_steps = [s for s in result.steps if s.kind is StepKind.WORKER]
        relative_cost = 0.0
        if self.cost_weight:
            dearest = await self.dearest_call(item)
            relative_cost = _workers_cost(worker_steps) / dearest if dearest > 0 else 0.0
        # Recursed: a later round's worker answered. A hand-back whose next round stopped (or
        # was invalid, which stops it) leaves the first round's answer, discounted.
        recursed = any(s.round > 0 and s.kind is StepKind.WORKER for s in result.steps)
        reward = method_reward(valid=True, correct=correct)
        if self.recursion and not recursed:
            reward *= self.recursion.first_round_discount
        reward = max(INVALID, reward - self.cost_weight * relative_cost)
        return Rollout(
            reward,
            True,
            correct,
            len(worker_steps),
            recursed=recursed,
            workers=tuple(s.worker for s in worker_steps),
            sees_earlier=any(s.visible_steps for s in worker_steps),
            relative_cost=relative_cost,
        )

    async def dearest_call(self, item: EvalItem) -> float:
        """The most expensive single call on ``item``'s question: each worker of the pool asked
        it alone (the question as asked), once; remembered per question. A group's samples are
        scored at once, so the first of them starts the measurement and the others await it
        (on live workers, each call is paid). Calls that fail count 0 (a replay worker not
        recorded on it)."""
        if item.key not in self._dearest_call:
            self._dearest_call[item.key] = asyncio.ensure_future(self._measure_dearest(item))
        return await self._dearest_call[item.key]

    async def _measure_dearest(self, item: EvalItem) -> float:
        one_step = self.variant.model_copy(update={"max_steps": 1, "recursion_rounds": 0})
        names = [w.name for w in self.pool.workers]

        async def alone(model_id: int) -> float:
            executor = WorkflowExecutor(
                planner=_GivenPlan(fallback_plan(model_id), "each worker alone"),
                pool=self.pool,
                gateway=self.gateway,
            )
            with simulating(item, self.seed):
                result = await executor.run(item.question, one_step, pool=names)
            return _workers_cost([s for s in result.steps if s.kind is StepKind.WORKER])

        return max(await asyncio.gather(*(alone(i) for i in range(len(names)))), default=0.0)

    def reward_function(self) -> Callable[..., Any]:
        """The function GRPOTrainer calls (async: TRL runs it on its event loop thread)."""

        async def plan_reward(
            prompts: list[str],
            completions: list[str],
            item_key: list[str],
            pool_names: list[list[str]],
            log_metric: Callable[[str, float], None] | None = None,
            **_: Any,
        ) -> list[float]:
            mode = self.recursion.generation_mode() if self.recursion else nullcontext()
            with mode:
                rollouts = await asyncio.gather(
                    *(
                        self.score(text, key, names)
                        for text, key, names in zip(completions, item_key, pool_names, strict=True)
                    )
                )
            if log_metric is not None:
                log_metric_summary(
                    log_metric,
                    rollouts,
                    recursion=self.recursion is not None,
                    workers=[w.name for w in self.pool.workers],
                    cost_aware=bool(self.cost_weight),
                )
            return [r.reward for r in rollouts]

        return plan_reward


def _workers_cost(steps: Sequence[StepRecord]) -> float:
    return sum(step.cost_usd for step in steps)


def log_metric_summary(
    log_metric: Callable[[str, float], None],
    rollouts: Sequence[Rollout],
    *,
    recursion: bool,
    workers: Sequence[str] = (),
    cost_aware: bool = False,
) -> None:
    """The batch's metrics; with ``workers``, how the valid plans routed: per worker the share
    of them that gave it a step, and the share with a step that saw an earlier one's output;
    ``cost_aware``: the valid plans' mean cost relative to their question's dearest call."""
    valid = [r for r in rollouts if r.valid]
    log_metric(FORMAT_VALID, len(valid) / len(rollouts))
    log_metric(ACCURACY, sum(r.correct for r in rollouts) / len(rollouts))
    log_metric(STEPS_PER_PLAN, sum(r.steps for r in valid) / len(valid) if valid else 0.0)
    if valid and workers:
        for worker in workers:
            share = sum(worker in r.workers for r in valid) / len(valid)
            log_metric(WORKER_SHARE + worker, share)
        log_metric(SEES_EARLIER, sum(r.sees_earlier for r in valid) / len(valid))
    if valid and cost_aware:
        log_metric(PLAN_COST, sum(r.relative_cost for r in valid) / len(valid))
    if recursion:
        log_metric(RECURSION_RATE, sum(r.recursed for r in rollouts) / len(rollouts))
