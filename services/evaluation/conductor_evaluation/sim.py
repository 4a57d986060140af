"""The simulated provider ``sim``: workers that answer evaluation items by the dice, not by an LLM.

A simulated worker is right with the probability its profile gives for the item's domain and
difficulty (an item-response curve: weak workers are right on easy items, only strong ones on
hard items); right answers come from the item's key, wrong ones are plausible (a nearby
number, another letter, a stub function). A step that sees earlier answers and is asked to
check them gains: when one of those answers is right, it is right with p + check_gain * (1 - p).
Tokens, cost and latency follow the profile. It exists to evaluate and train orchestration at
zero cost; every report says when it was used. It answers only the item the harness is
evaluating or training on (``evaluating``), as the ``replay`` provider does.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import ProviderRejected
from conductor.pool import Pool, Price, Provider, SimProfile, WorkerSpec
from conductor.streaming import WholeAnswerStream
from conductor_evaluation.items import AnswerKind, Domain, EvalItem, choice_letter

# A subtask "asks to check" earlier answers when it says so in one of these words.
CHECK_WORDS = re.compile(
    r"\b(check|verify|review|critique|correct|double-check|confirm|improve|refine|fix|"
    r"aggregate|synthesi[sz]e|combine|compare|judge|evaluate|best)\w*",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class SimTask:
    """The item that workers answering evaluation items only (``sim``, ``replay``) answer in
    this context, and the seed of the simulator's dice."""

    item: EvalItem
    seed: int = 0


_CURRENT: ContextVar[SimTask | None] = ContextVar("conductor_sim_task", default=None)


@contextmanager
def evaluating(item: EvalItem, seed: int = 0) -> Iterator[None]:
    """Simulated and replayed workers called within (tasks started inside inherit it) answer
    ``item``: they answer nothing else, having nothing real to answer with."""
    token = _CURRENT.set(SimTask(item, seed))
    try:
        yield
    finally:
        _CURRENT.reset(token)


simulating = evaluating  # its first name, kept for its callers


def evaluated_task() -> SimTask | None:
    """The item being evaluated or trained on here, if any (``evaluating``)."""
    return _CURRENT.get()


@dataclass(frozen=True)
class SimAnswer:
    text: str
    right: bool
    usage: Usage
    latency_s: float


async def simulate(worker: str, profile: SimProfile, messages: Sequence[ChatMessage]) -> SimAnswer:
    """One simulated call: roll the worker's skill for this item and render the answer."""
    from conductor_evaluation.verify import verify  # the verifiers pull in math-verify

    task = _CURRENT.get()
    if task is None:
        raise ProviderRejected(
            f"worker {worker!r} is simulated: it answers evaluation items only "
            "(conductor eval, conductor train), and none is being evaluated here"
        )
    item = task.item
    if item.kind is AnswerKind.REPLAY:
        raise ProviderRejected(
            f"worker {worker!r} is simulated: {item.key} is a question of an outcome table, "
            "judged by recorded scores that a simulated answer does not have"
        )
    subtask = next((m.content for m in reversed(messages) if m.role == "user"), "")
    seen = [m.content for m in messages if m.role == "assistant"]
    p = profile.chance(item.domain, item.difficulty)
    if seen and CHECK_WORDS.search(subtask):
        verdicts = [await verify(item, answer) for answer in seen]
        if any(v.correct for v in verdicts):
            p += profile.check_gain * (1 - p)
    rng = random.Random(_digest(task.seed, worker, item.key, messages))
    right = rng.random() < p
    text = render_right(item) if right else await render_wrong(item, rng)
    prompt_tokens = sum(len(m.content) for m in messages) // 4 + 1
    completion_tokens = max(1, round(rng.gauss(profile.output_tokens, profile.output_tokens / 5)))
    latency = profile.latency_s + profile.latency_per_token_s * completion_tokens
    return SimAnswer(
        text=text,
        right=right,
        usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
        latency_s=latency,
    )


def _digest(seed: int, worker: str, key: str, messages: Sequence[ChatMessage]) -> int:
    h = hashlib.sha256(f"{seed}\0{worker}\0{key}".encode())
    for message in messages:
        h.update(f"\0{message.role}\0{message.content}".encode())
    return int.from_bytes(h.digest()[:8], "big")


def render_right(item: EvalItem) -> str:
    match item.kind:
        case AnswerKind.MATH:
            return (
                f"Working through it step by step. The final answer is $\\boxed{{{item.answer}}}$."
            )
        case AnswerKind.CHOICE:
            return f"Comparing the options, the answer is ({item.answer})."
        case AnswerKind.CODE:
            return f"Here is the solution:\n```python\n{item.reference or item.answer}\n```"
        case AnswerKind.REGEX:
            if item.reference is None:
                raise ProviderRejected(
                    f"item {item.key}: the sim provider needs a 'reference' answer for regex items"
                )
            return f"Answer: {item.reference}"
        case _:
            return f"Working through it step by step.\nAnswer: {item.answer}"


async def render_wrong(item: EvalItem, rng: random.Random) -> str:
    """A plausible wrong answer, checked to be wrong (a near miss can land on the key)."""
    from conductor_evaluation.verify import verify

    if item.kind is AnswerKind.CODE:
        # A stub with the right name: looks like an answer, fails the tests.
        name = item.entry_point or "solution"
        prefix = item.code_prefix if item.code_prefix else f"def {name}(*args, **kwargs):\n"
        return f"Here is the solution:\n```python\n{prefix.rstrip()}\n    return None\n```"
    for _ in range(3):
        text = _wrong_text(item, rng)
        if not (await verify(item, text)).correct:
            return text
    return "I could not work this out."


def _wrong_text(item: EvalItem, rng: random.Random) -> str:
    if item.kind is AnswerKind.CHOICE:
        count = len(item.choices) or 4
        letters = [choice_letter(i) for i in range(count) if choice_letter(i) != item.answer]
        return f"Comparing the options, the answer is ({rng.choice(letters)})."
    if item.kind is AnswerKind.REGEX:
        return "Answer: I am not sure."
    wrong = _near_miss(item.answer, rng)
    if item.kind is AnswerKind.MATH:
        return f"Working through it step by step. The final answer is $\\boxed{{{wrong}}}$."
    if item.kind is AnswerKind.EXACT and item.choices:
        wrong = rng.choice([c for c in item.choices if c != item.answer] or [wrong])
    return f"Working through it step by step.\nAnswer: {wrong}"


def _near_miss(answer: str, rng: random.Random) -> str:
    plain = answer.replace(",", "").strip()
    try:
        number = int(plain)
    except ValueError:
        pass
    else:
        step = rng.randint(1, max(3, abs(number) // 5))
        return str(number + rng.choice((-1, 1)) * step)
    try:
        value = float(plain)
    except ValueError:
        pass
    else:
        return f"{(value or 1.0) * rng.choice((0.5, 1.5, 2.0)):g}"
    if len(plain) > 1 and plain[::-1] != plain:
        return plain[::-1] if not plain.startswith("\\") else f"{plain} + 1"
    return f"{plain} + 1" if plain else "1"


def _sim_worker(
    name: str,
    description: str,
    skills: dict[Domain, float],
    price: tuple[float, float],
    *,
    default: float,
    output_tokens: int,
    latency_s: float,
) -> WorkerSpec:
    return WorkerSpec(
        name=name,
        provider=Provider.SIM,
        model=f"sim/{name}",
        description=f"[simulated] {description}",
        price=Price(input=price[0], output=price[1]),
        sim=SimProfile(
            skills=skills,
            default=default,
            check_gain=0.5,
            output_tokens=output_tokens,
            latency_s=latency_s,
            latency_per_token_s=0.00005,
        ),
    )


def builtin_sim_pool() -> Pool:
    """``--pool sim``: four simulated workers whose strengths differ by domain and price."""
    d = Domain
    return Pool(
        workers=(
            _sim_worker(
                "sim-frontier",
                "A large frontier model: strong at everything, and the most expensive.",
                {d.MATH: 0.8, d.KNOWLEDGE: 0.85, d.CODE: 0.75, d.REASONING: 0.75},
                (3.0, 15.0),
                default=0.8,
                output_tokens=500,
                latency_s=0.04,
            ),
            _sim_worker(
                "sim-math",
                "A math specialist: excellent at math and logic puzzles, weak elsewhere.",
                {d.MATH: 0.9, d.KNOWLEDGE: 0.45, d.CODE: 0.4, d.REASONING: 0.8},
                (0.5, 2.0),
                default=0.45,
                output_tokens=400,
                latency_s=0.03,
            ),
            _sim_worker(
                "sim-coder",
                "A coding specialist: writes correct Python, middling at math and knowledge.",
                {d.MATH: 0.5, d.KNOWLEDGE: 0.5, d.CODE: 0.85, d.REASONING: 0.55},
                (0.8, 3.2),
                default=0.5,
                output_tokens=350,
                latency_s=0.03,
            ),
            _sim_worker(
                "sim-small",
                "A small fast model: cheap, fine for easy questions, often wrong on hard ones.",
                {d.MATH: 0.3, d.KNOWLEDGE: 0.55, d.CODE: 0.25, d.REASONING: 0.3},
                (0.1, 0.4),
                default=0.35,
                output_tokens=150,
                latency_s=0.01,
            ),
        )
    )


class SimWorker(WholeAnswerStream):
    """The ``sim`` provider's worker: simulated answers with the latency their profile gives."""

    def __init__(self, name: str, model: str, profile: SimProfile) -> None:
        self.name = name
        self.model = model
        self.profile = profile

    @classmethod
    def from_spec(cls, spec: WorkerSpec) -> SimWorker:
        assert spec.sim is not None  # WorkerSpec refuses a sim worker without its profile
        return cls(spec.name, spec.model, spec.sim)

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        answer = await simulate(self.name, self.profile, messages)
        await asyncio.sleep(answer.latency_s)
        return Completion(
            text=answer.text, usage=answer.usage, model=self.model, finish_reason="stop"
        )

    async def aclose(self) -> None:
        """Nothing to release."""
