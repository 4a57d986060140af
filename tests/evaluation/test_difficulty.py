"""Item difficulty: read from what each dataset records, and the simulated workers' chance of a
right answer following it (an item-response curve), so the best worker depends on the item."""

from __future__ import annotations

import statistics

import pytest

from conductor.pool import Domain, SimProfile
from conductor_evaluation import difficulty
from conductor_evaluation.datasets import load_suite
from conductor_evaluation.items import AnswerKind, EvalItem
from conductor_evaluation.sim import builtin_sim_pool


def test_each_scale_reads_what_its_dataset_records() -> None:
    assert [difficulty.math_level(f"Level {n}") for n in range(1, 6)] == [0, 0.25, 0.5, 0.75, 1]
    assert difficulty.math_level("Level ?") is None
    assert difficulty.math_level(7) is None
    one_step = "She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"
    nine_steps = " ".join(["<<1+1=2>>2"] * 9)
    assert difficulty.gsm8k_steps(one_step) == 0.0
    assert difficulty.gsm8k_steps(nine_steps) == 1.0
    assert difficulty.arc_set("arc-easy") < difficulty.arc_set("arc-challenge")
    assert (
        difficulty.mmlu_subject("elementary_mathematics")
        < difficulty.mmlu_subject("high_school_physics")
        < difficulty.mmlu_subject("college_physics")
    )
    assert difficulty.mmlu_subject("virology") == difficulty.MMLU_OTHER
    assert difficulty.code_lines("def f(x):\n    # doubles\n    return 2 * x\n") == 0.0
    long = "def f(x):\n" + "".join(f"    x += {n}\n" for n in range(30))
    assert difficulty.code_lines(long) == 1.0


@pytest.mark.parametrize(
    ("suite", "low", "high"),
    [("math500", 0.5, 0.7), ("gsm8k", 0.2, 0.45), ("mmlu", 0.45, 0.6), ("mbpp", 0.15, 0.4)],
)
def test_builtin_suites_carry_a_spread_of_difficulties(suite: str, low: float, high: float) -> None:
    values = [item.difficulty for item in load_suite(suite)]
    assert all(v is not None and 0 <= v <= 1 for v in values)
    assert low < statistics.mean(v for v in values if v is not None) < high
    assert len(set(values)) >= 3


def test_the_curve_is_the_skill_at_average_difficulty_and_falls_with_it() -> None:
    profile = SimProfile(skills={Domain.MATH: 0.6})
    assert profile.chance(Domain.MATH, None) == 0.6
    assert profile.chance(Domain.MATH, 0.5) == pytest.approx(0.6)
    chances = [profile.chance(Domain.MATH, d / 10) for d in range(11)]
    assert chances == sorted(chances, reverse=True)
    # Two log-odds either side at the default slope: 0.6 -> 0.917 (easiest), 0.168 (hardest).
    assert chances[0] == pytest.approx(0.917, abs=0.001)
    assert chances[-1] == pytest.approx(0.168, abs=0.001)
    flat = SimProfile(skills={Domain.MATH: 0.6}, difficulty_slope=0)
    assert flat.chance(Domain.MATH, 1.0) == pytest.approx(0.6)
    # Always right (or wrong) stays so on every item.
    assert SimProfile(default=1.0).chance(Domain.CODE, 1.0) == 1.0
    assert SimProfile(default=0.0).chance(Domain.CODE, 0.0) == 0.0


def test_the_builtin_pool_makes_the_cheap_worker_enough_on_easy_items_only() -> None:
    """What routing can exploit: on easy math the small worker is nearly as good as the
    frontier one at a thirtieth of the price; on hard math it is far behind."""
    workers = {w.name: w for w in builtin_sim_pool().workers}
    small, frontier = workers["sim-small"], workers["sim-frontier"]
    assert small.sim is not None
    assert frontier.sim is not None
    easy = small.sim.chance(Domain.MATH, 0.0), frontier.sim.chance(Domain.MATH, 0.0)
    hard = small.sim.chance(Domain.MATH, 1.0), frontier.sim.chance(Domain.MATH, 1.0)
    assert easy[1] - easy[0] < 0.25
    assert hard[1] - hard[0] > 0.25
    assert frontier.price.output / small.price.output >= 30


async def test_simulated_answers_follow_the_items_difficulty() -> None:
    from conductor.chat import ChatMessage
    from conductor_evaluation.sim import simulate, simulating

    profile = SimProfile(skills={Domain.MATH: 0.5})
    messages = [ChatMessage(role="user", content="Question: 6*7?\n\nYour task: solve it")]

    async def rate(level: float) -> float:
        item = EvalItem(
            suite="t",
            id=str(level),
            question="What is 6 * 7?",
            answer="42",
            kind=AnswerKind.MATH,
            domain=Domain.MATH,
            difficulty=level,
        )
        right = 0
        for seed in range(500):
            with simulating(item, seed):
                right += (await simulate("w", profile, messages)).right
        return right / 500

    assert await rate(0.0) == pytest.approx(profile.chance(Domain.MATH, 0.0), abs=0.05)
    assert await rate(1.0) == pytest.approx(profile.chance(Domain.MATH, 1.0), abs=0.05)
