"""The simulated provider: right as often as its profile says, wrong plausibly, checks gain."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conductor.chat import ChatMessage
from conductor.errors import ConfigurationError, ProviderRejected
from conductor.pool import Price, Provider, SimProfile, WorkerSpec, parse_pool
from conductor_evaluation.items import AnswerKind, Domain, EvalItem
from conductor_evaluation.sim import SimWorker, builtin_sim_pool, render_right, simulate, simulating
from conductor_evaluation.verify import verify
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.registry import build_workers

SIM_PROVIDER = {Provider.SIM: SimWorker.from_spec}

MATH = EvalItem(
    suite="t",
    id="1",
    question="What is 6 * 7?",
    answer="42",
    kind=AnswerKind.MATH,
    domain=Domain.MATH,
)
CHOICE = EvalItem(
    suite="t",
    id="2",
    question="Pick B.\nA. x\nB. y\nC. z",
    answer="B",
    kind=AnswerKind.CHOICE,
    domain=Domain.KNOWLEDGE,
    choices=("x", "y", "z"),
)
CODE = EvalItem(
    suite="t",
    id="3",
    question="Write add(a, b).",
    answer="",
    kind=AnswerKind.CODE,
    domain=Domain.CODE,
    tests="assert add(2, 3) == 5",
    entry_point="add",
    reference="def add(a, b):\n    return a + b\n",
)
EXACT = EvalItem(
    suite="t", id="4", question="Capital of France?", answer="Paris", kind=AnswerKind.EXACT
)
LATEX = EvalItem(
    suite="t",
    id="5",
    question="Simplify.",
    answer="\\frac{14}{3}",
    kind=AnswerKind.MATH,
    domain=Domain.MATH,
)


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=f"Question: {text}\n\nYour task: solve it")]


def checking(earlier_answer: str, subtask: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="user", content="Question: What is 6 * 7?\n\nYour task: solve it"),
        ChatMessage(role="assistant", content=earlier_answer),
        ChatMessage(role="user", content=subtask),
    ]


async def right_rate(
    profile: SimProfile, item: EvalItem, messages: list[ChatMessage], trials: int = 600
) -> float:
    right = 0
    for seed in range(trials):
        with simulating(item, seed):
            right += (await simulate("w", profile, messages)).right
    return right / trials


async def test_without_an_item_under_evaluation_the_sim_refuses_clearly() -> None:
    with pytest.raises(ProviderRejected, match="answers evaluation items only"):
        await simulate("w", SimProfile(), ask("hi"))


async def test_right_as_often_as_the_domain_skill_says() -> None:
    profile = SimProfile(skills={Domain.MATH: 0.8, Domain.KNOWLEDGE: 0.3}, default=0.1)
    assert await right_rate(profile, MATH, ask("6*7")) == pytest.approx(0.8, abs=0.05)
    assert await right_rate(profile, CHOICE, ask("pick")) == pytest.approx(0.3, abs=0.05)
    assert await right_rate(profile, EXACT, ask("capital")) == pytest.approx(0.1, abs=0.04)


async def test_a_check_of_a_right_answer_gains_and_nothing_else_does() -> None:
    profile = SimProfile(skills={Domain.MATH: 0.4}, check_gain=0.5)
    right_seen = render_right(MATH)
    wrong_seen = "The final answer is $\\boxed{41}$."
    gained = await right_rate(profile, MATH, checking(right_seen, "Check the answer above."))
    assert gained == pytest.approx(0.4 + 0.5 * 0.6, abs=0.05)
    # A wrong earlier answer gives nothing to confirm; seeing a right one without being
    # asked to check it gives nothing either.
    assert await right_rate(profile, MATH, checking(wrong_seen, "Check the answer above.")) == (
        pytest.approx(0.4, abs=0.05)
    )
    assert await right_rate(profile, MATH, checking(right_seen, "Now translate it to French.")) == (
        pytest.approx(0.4, abs=0.05)
    )


@pytest.mark.parametrize("item", [MATH, CHOICE, CODE, EXACT, LATEX], ids=lambda i: i.kind.value)
async def test_answers_verify_as_rolled(item: EvalItem) -> None:
    """Right answers pass the item's own verifier and wrong ones fail it, for every kind."""
    seen = {True: 0, False: 0}
    for seed in range(12):
        with simulating(item, seed):
            answer = await simulate("w", SimProfile(default=0.5, skills={}), ask(item.question))
        verdict = await verify(item, answer.text)
        assert verdict.correct is answer.right, (answer.text, verdict)
        seen[answer.right] += 1
    assert seen[True]
    assert seen[False]


async def test_the_same_seed_and_messages_give_the_same_answer() -> None:
    profile = SimProfile(default=0.5)
    with simulating(MATH, 3):
        first = await simulate("w", profile, ask("6*7"))
        again = await simulate("w", profile, ask("6*7"))
    assert first == again


async def test_through_the_gateway_usage_is_priced_by_the_pool() -> None:
    pool = builtin_sim_pool()
    gateway = WorkerGateway(pool, build_workers(pool, providers=SIM_PROVIDER))
    with simulating(MATH, 0):
        call = await gateway.call("sim-frontier", ask("6*7"))
    assert call.usage.completion_tokens > 0
    assert call.usage.prompt_tokens > 0
    assert call.cost_usd == pytest.approx(pool.get("sim-frontier").price.cost(call.usage))
    assert all(w.description.startswith("[simulated]") for w in pool.workers)
    await gateway.aclose()


def test_a_pool_file_declares_sim_workers_and_their_profile_is_checked() -> None:
    pool = parse_pool(
        {
            "workers": {
                "s": {
                    "provider": "sim",
                    "model": "sim/s",
                    "sim": {"skills": {"math": 0.7}, "check_gain": 0.2},
                }
            }
        }
    )
    spec = pool.get("s")
    assert spec.simulated
    assert spec.sim is not None
    assert spec.sim.skill(Domain.MATH) == 0.7
    assert spec.availability({}) is None
    with pytest.raises(ConfigurationError, match="needs a 'sim' section"):
        parse_pool({"workers": {"s": {"provider": "sim", "model": "m"}}})
    with pytest.raises(ConfigurationError, match="probabilities"):
        parse_pool(
            {"workers": {"s": {"provider": "sim", "model": "m", "sim": {"skills": {"math": 1.5}}}}}
        )
    with pytest.raises(ValidationError, match="provider 'sim' workers only"):
        WorkerSpec(
            name="x",
            provider=Provider.OPENAI_COMPATIBLE,
            model="m",
            base_url="http://h",
            price=Price(),
            sim=SimProfile(),
        )
