"""The GRPO reward: each sampled Conductor output is parsed, run through the real executor on
the configured pool, and the final answer verified, exactly as the method scores it:

- 0 when the three lists cannot be parsed or the plan is invalid for the pool it was shown,
- 0.5 when the plan is well-formed but the final answer is wrong (or the workflow failed),
- 1 when the final answer is right.

Rollouts of one batch run concurrently (the workers are slow I/O); simulated workers answer the
item being scored (``simulating``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conductor.evaluation.items import EvalItem
from conductor.evaluation.sim import simulating
from conductor.evaluation.verify import verify
from conductor.pool import Pool
from conductor.ports import PlanRequest, StepRunner
from conductor.profiles import MAX_STEPS_LIMIT, Profile
from conductor.protocol import ParseFailure, parse_plan, validate_plan
from conductor.workflow import Plan, PlanOutcome, StepKind, WorkflowStatus
from conductor_aggregator.executor import WorkflowExecutor
from conductor_trainer.strategies import given_outcome

INVALID, WRONG, RIGHT = 0.0, 0.5, 1.0


@dataclass(frozen=True)
class Rollout:
    reward: float
    valid: bool
    correct: bool
    steps: int
    errors: tuple[str, ...] = ()


class _GivenPlan:
    """A planner that hands the executor the plan the policy sampled."""

    def __init__(self, given: Plan, raw: str) -> None:
        self.given, self.raw = given, raw

    async def plan(self, request: PlanRequest) -> PlanOutcome:
        return given_outcome(request, self.given, raw_output=self.raw, backend="grpo-rollout")


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
    ) -> None:
        self.pool = pool
        self.gateway = gateway
        self.items = items
        self.max_steps = max_steps
        self.seed = seed
        self.profile = Profile(
            name="grpo-rollout",
            description="a sampled plan run for its reward",
            max_steps=max_steps,
            recursion_rounds=0,
            step_timeout_s=step_timeout_s,
            workflow_timeout_s=step_timeout_s * max_steps * 2,
        )

    async def score(self, text: str, item_key: str, pool_names: Sequence[str]) -> Rollout:
        parsed = parse_plan(text)
        if isinstance(parsed, ParseFailure):
            return Rollout(INVALID, False, False, 0, (parsed.reason,))
        checked = validate_plan(
            parsed,
            pool_size=len(pool_names),
            max_steps=self.max_steps,
            conductor_id=None,
            allow_stop=False,
        )
        if checked.errors or checked.plan is None:
            return Rollout(INVALID, False, False, 0, tuple(checked.errors))
        item = self.items[item_key]
        executor = WorkflowExecutor(
            planner=_GivenPlan(checked.plan, text), pool=self.pool, gateway=self.gateway
        )
        seed = int.from_bytes(hashlib.sha256(f"{self.seed}\0{text}".encode()).digest()[:4], "big")
        with simulating(item, seed):
            result = await executor.run(item.question, self.profile, pool=list(pool_names))
            correct = (
                result.status is WorkflowStatus.COMPLETED
                and (await verify(item, result.answer)).correct
            )
        steps = sum(1 for s in result.steps if s.kind is StepKind.WORKER)
        return Rollout(RIGHT if correct else WRONG, True, correct, steps)

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
            rollouts = await asyncio.gather(
                *(
                    self.score(text, key, names)
                    for text, key, names in zip(completions, item_key, pool_names, strict=True)
                )
            )
            if log_metric is not None:
                log_metric_summary(log_metric, rollouts)
            return [r.reward for r in rollouts]

        return plan_reward


def log_metric_summary(
    log_metric: Callable[[str, float], None], rollouts: Sequence[Rollout]
) -> None:
    valid = [r for r in rollouts if r.valid]
    log_metric("format_valid", len(valid) / len(rollouts))
    log_metric("accuracy", sum(r.correct for r in rollouts) / len(rollouts))
    log_metric("steps_per_plan", sum(r.steps for r in valid) / len(valid) if valid else 0.0)
