"""The answer verifiers: each kind's phrasings, math equivalences, and robustness (they are the
reinforcement-learning reward: no model output may crash or hang them)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conductor.errors import ConfigurationError
from conductor_evaluation import checkers
from conductor_evaluation.items import AnswerKind, EvalItem
from conductor_evaluation.verify import check, check_math, verify

pytestmark = [pytest.mark.processes]

M, C, E, R = AnswerKind.MATH, AnswerKind.CHOICE, AnswerKind.EXACT, AnswerKind.REGEX
CAPITALS = ("London", "Paris", "Rome", "Berlin")
POLAR = "\\left( 3, \\frac{\\pi}{2} \\right)"


def make_item(kind: AnswerKind, answer: str, choices: tuple[str, ...] = ()) -> EvalItem:
    return EvalItem(suite="t", id="1", question="?", answer=answer, kind=kind, choices=choices)


CASES: list[Any] = [
    # GSM8K: the reference is a bare number.
    pytest.param(M, "18", "...so she makes $18 every day. The answer is 18.", True, id="gsm-is"),
    pytest.param(M, "18", "She sells 16 - 3 - 4 = 9 eggs.\n#### 18", True, id="gsm-hashes"),
    pytest.param(M, "18", "So she makes \\boxed{18} dollars.", True, id="gsm-boxed"),
    pytest.param(M, "18", "18.0", True, id="gsm-decimal"),
    pytest.param(M, "1000", "1,000", True, id="gsm-thousands"),
    pytest.param(M, "1000", "The answer is \\$1,000.", True, id="gsm-dollars-thousands"),
    pytest.param(M, "1000000", "\\boxed{1{,}000{,}000}", True, id="gsm-latex-thousands"),
    pytest.param(M, "18", "The answer is $18.00", True, id="gsm-currency"),
    pytest.param(M, "18", "The answer is: **18** eggs.", True, id="gsm-markdown-units"),
    pytest.param(M, "18", "The answer is 18 because she has 3 left.", True, id="gsm-prose-after"),
    pytest.param(M, "18", "Answer:\n18", True, id="gsm-next-line"),
    pytest.param(M, "18", "17", False, id="gsm-wrong"),
    pytest.param(
        M, "18", "She has 18 eggs, then buys 2 more.\nThe answer is 20.", False, id="gsm-18-then-20"
    ),
    pytest.param(M, "18", "\\boxed{1} no wait: \\boxed{18}", True, id="last-boxed-wins"),
    # MATH-500: the reference is LaTeX.
    pytest.param(M, "\\frac{1}{2}", "0.5", True, id="math-half"),
    pytest.param(M, "\\frac{14}{3}", "\\boxed{\\dfrac{14}{3}}", True, id="math-dfrac"),
    pytest.param(M, POLAR, "The point is \\boxed{(3, \\frac{\\pi}{2})}.", True, id="math-polar"),
    pytest.param(M, POLAR, f"The answer is {POLAR}", True, id="math-polar-undelimited"),
    pytest.param(M, POLAR, "The answer is 3", False, id="math-polar-first-only"),
    pytest.param(M, "2\\sqrt{2}", "\\boxed{\\sqrt{8}}", True, id="math-sqrt"),
    pytest.param(M, "[2,5)", "x lies in \\boxed{[2,5)}", True, id="math-interval"),
    pytest.param(M, "[2,5)", "\\boxed{[2,5]}", False, id="math-interval-closed"),
    pytest.param(M, "p - q", "\\boxed{-q + p}", True, id="math-expression"),
    pytest.param(M, "p - q", "\\boxed{q - p}", False, id="math-expression-wrong"),
    pytest.param(M, "\\text{Evelyn}", "The answer is Evelyn.", True, id="math-text"),
    pytest.param(M, "\\frac12", "The answer is 1/2", True, id="math-slash"),
    # Multiple choice.
    pytest.param(C, "A", "A. Because of the tides.", True, id="choice-starts"),
    pytest.param(C, "B", "(B)", True, id="choice-parenthesised"),
    pytest.param(C, "B", "B", True, id="choice-bare"),
    pytest.param(C, "C", "c", True, id="choice-bare-lower"),
    pytest.param(C, "C", "Thus \\boxed{C}", True, id="choice-boxed"),
    pytest.param(C, "C", "so the answer is (c)", True, id="choice-lower"),
    pytest.param(C, "D", "Answer: **D**", True, id="choice-markdown"),
    pytest.param(C, "B", "I pick option B.", True, id="choice-option"),
    pytest.param(C, "C", "A? (B)? The answer is (C), not (D).", True, id="choice-answer-wins"),
    pytest.param(C, "B", "The answer is a bit subtle: (B)", True, id="choice-not-article"),
    pytest.param(C, "B", "It must be Paris.", True, id="choice-text"),  # options: CAPITALS
    pytest.param(C, "A", "The answer is (B).", False, id="choice-wrong"),
    pytest.param(C, "A", "Answer: E", False, id="choice-out-of-range"),
    # Exact.
    pytest.param(E, "Paris", 'The capital is Paris.\nAnswer: "Paris".', True, id="exact-quoted"),
    pytest.param(E, "Paris", "**PARIS**", True, id="exact-case"),
    pytest.param(E, "New York", "Final answer:  new   york.", True, id="exact-spacing"),
    pytest.param(E, "Paris", "I think London.", False, id="exact-wrong"),
    # Regex.
    pytest.param(R, r"\b(42|forty[- ]two)\b", "It is Forty Two.", True, id="regex"),
    pytest.param(R, r"\b42\b", "It is 420.", False, id="regex-wrong"),
    pytest.param(R, r"(unclosed", "anything", False, id="regex-invalid"),
]


@pytest.mark.parametrize(("kind", "reference", "response", "expected"), CASES)
async def test_verdicts(kind: AnswerKind, reference: str, response: str, expected: bool) -> None:
    choices = CAPITALS if kind is C else ()
    verdict = await verify(make_item(kind, reference, choices), response)
    assert verdict.correct is expected, verdict


@pytest.mark.parametrize("response", [None, "", "  \n"], ids=["none", "empty", "blank"])
@pytest.mark.parametrize("kind", [M, C, E, R, AnswerKind.CODE])
async def test_no_response(kind: AnswerKind, response: str | None) -> None:
    verdict = await verify(make_item(kind, "18"), response)
    assert not verdict.correct
    assert verdict.detail == "no response"


@pytest.mark.parametrize(
    ("body", "expected"), [("a + b", True), ("a - b", False)], ids=["right", "wrong"]
)
async def test_code_is_run_by_the_sandbox(body: str, expected: bool) -> None:
    item = EvalItem(
        suite="t",
        id="1",
        question="Write add(a, b).",
        answer="",
        kind=AnswerKind.CODE,
        tests="assert add(2, 3) == 5",
        entry_point="add",
    )
    response = f"Here:\n```python\ndef add(a, b):\n    return {body}\n```"
    assert (await verify(item, response)).correct is expected


def test_extracted_answers() -> None:
    assert check_math("18", "#### 18").extracted == "18"
    assert check_math("\\frac{14}{3}", "\\boxed{\\dfrac{14}{3}}").extracted == "\\dfrac{14}{3}"
    assert check(make_item(C, "C"), "the answer is (c)").extracted == "C"
    assert check(make_item(R, r"\d+"), "it is 42").extracted == "42"


# --- reasoning-gym -----------------------------------------------------------------------------


def rg_item(generator: str, seed: int = 3, index: int = 1) -> tuple[EvalItem, str]:
    import reasoning_gym  # type: ignore[import-untyped]

    entry = reasoning_gym.create_dataset(generator, seed=seed, size=index + 1)[index]
    metadata = {"generator": generator, "seed": seed, "index": index, "size": index + 1}
    item = EvalItem(
        suite=f"rg:{generator}",
        id=str(index),
        question=f"{entry['question']}\n\nGive only the final answer after 'Answer:'.",
        answer=str(entry["answer"]),
        kind=AnswerKind.REASONING_GYM,
        metadata=metadata,
    )
    return item, str(entry["answer"])


RG_CASES = [
    pytest.param("chain_sum", lambda a: f"Adding up.\nAnswer: {a}", True, id="chain-sum"),
    pytest.param("chain_sum", lambda a: f"Answer: {int(a) + 1}", False, id="chain-sum-wrong"),
    pytest.param("basic_arithmetic", lambda a: f"Answer: **{a}**.", True, id="arithmetic-markdown"),
    pytest.param("leg_counting", lambda a: f"<answer>{a}</answer>", True, id="legs-tags"),
    # score_answer gives partial credit when the answer is inside other text: wrong here.
    pytest.param("leg_counting", lambda a: f"Answer: 1{a}", False, id="legs-partial"),
    pytest.param("spell_backward", lambda a: f"Answer: {a.upper()}", True, id="spell-case"),
    pytest.param("spell_backward", lambda a: f"Answer: {a[:-1]}x", False, id="spell-partial"),
    pytest.param("letter_counting", lambda a: f"Counting.\n\n{a}", True, id="letters-last-line"),
    pytest.param("rotate_matrix", lambda a: f"Rotated:\nAnswer:\n{a}\n", True, id="grid-below"),
    pytest.param("tower_of_hanoi", lambda a: f"Answer: {a}", True, id="moves-on-lines"),
]


@pytest.mark.parametrize(("generator", "respond", "expected"), RG_CASES)
async def test_reasoning_gym(generator: str, respond: Callable[[str], str], expected: bool) -> None:
    item, answer = rg_item(generator)
    verdict = await verify(item, respond(answer))
    assert verdict.correct is expected, verdict


async def test_reasoning_gym_partial_credit_is_wrong() -> None:
    item, answer = rg_item("spell_backward")
    verdict = await verify(item, f"Answer: {answer[:-1]}x")
    assert not verdict.correct
    assert verdict.detail.startswith("score 0.")


async def test_reasoning_gym_score_above_one_is_wrong() -> None:
    """spell_backward sums 1/9 nine times to 1.0000000000000002 for a word plus a stray letter."""
    item, answer = rg_item("spell_backward", index=8)
    assert len(answer) == 9
    assert not (await verify(item, f"Answer: {answer}x")).correct
    assert (await verify(item, f"Answer: {answer}.")).correct


async def test_a_broken_item_raises() -> None:
    """A setup error is not the model's fault: it surfaces, through the checker process."""
    item, _ = rg_item("chain_sum")
    stale = item.model_copy(update={"question": "something else"})
    with pytest.raises(ConfigurationError, match="regenerates differently"):
        await verify(stale, "Answer: 1")


# --- robustness --------------------------------------------------------------------------------

GARBAGE = [
    pytest.param("x" * 100_000, id="letters"),
    pytest.param("answer is " * 10_000 + " " * 10_000, id="phrases"),
    pytest.param("\\boxed{" * 30_000 + "1", id="open-boxes"),
    pytest.param("{(" * 50_000, id="brackets"),
    pytest.param("*." * 50_000, id="wrappers"),
    pytest.param("1" * 100_000, id="digits"),
]


@pytest.mark.parametrize("garbage", GARBAGE)
async def test_garbage_is_quick_and_wrong(garbage: str) -> None:
    started = time.monotonic()
    for kind in (M, C, E, R):
        assert not (await verify(make_item(kind, "18"), garbage)).correct
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "response",
    ["\\boxed{9^{9^{9}}}", "\\boxed{(x+1)^{100000}}"],
    ids=["power-tower", "huge-polynomial"],
)
async def test_a_runaway_check_is_killed(response: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """sympy would take minutes; the checker process is killed, and the next check still works."""
    monkeypatch.setattr(checkers, "CHECK_TIMEOUT_S", 2.0)
    item = make_item(M, "18")
    started = time.monotonic()
    verdict = await verify(item, response)
    assert not verdict.correct
    assert "timed out" in verdict.detail
    assert time.monotonic() - started < 10
    assert (await verify(item, "\\boxed{18}")).correct


async def test_a_dead_checker_is_replaced() -> None:
    item = make_item(M, "18")
    assert (await verify(item, "\\boxed{18}")).correct
    for checker in checkers.checker_pool().checkers:
        if checker._process is not None:
            checker._process.kill()
            checker._process.wait()
    assert (await verify(item, "\\boxed{18}")).correct


def test_a_forked_process_gets_its_own_checkers() -> None:
    """A fork has none of the parent's executor threads and must not share its checkers."""
    item = make_item(M, "18")
    assert asyncio.run(verify(item, "\\boxed{18}")).correct
    parents = checkers.checker_pool()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads running
        pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = asyncio.run(verify(item, "\\boxed{18}")).correct
            ok = ok and checkers.checker_pool() is not parents
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert asyncio.run(verify(item, "\\boxed{18}")).correct


def test_verify_in_a_script_without_main_guard(tmp_path: Path) -> None:
    """The checkers are not multiprocessing children: those re-run an unguarded main script."""
    script = tmp_path / "score.py"
    script.write_text(
        "import asyncio\n"
        "from conductor_evaluation.items import AnswerKind, EvalItem\n"
        "from conductor_evaluation.verify import verify\n"
        "item = EvalItem(suite='t', id='1', question='?', answer='18', kind=AnswerKind.MATH)\n"
        "print(asyncio.run(verify(item, 'so \\\\boxed{18}')).correct)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr


async def test_verify_from_a_worker_thread() -> None:
    """math-verify's default signal timeouts work only in the main thread; ours are off."""
    item = make_item(M, "\\frac{14}{3}")
    verdict = await asyncio.to_thread(lambda: asyncio.run(verify(item, "\\boxed{\\dfrac{14}{3}}")))
    assert verdict.correct
    in_thread = await asyncio.to_thread(check_math, "2\\sqrt{2}", "\\boxed{\\sqrt{8}}")
    assert in_thread.correct


async def test_concurrent_checks() -> None:
    items = [make_item(M, str(n)) for n in range(40)]
    verdicts = await asyncio.gather(*(verify(item, f"\\boxed{{{item.answer}}}") for item in items))
    assert all(v.correct for v in verdicts)


def test_check_leaves_code_to_verify() -> None:
    with pytest.raises(ValueError, match="verify"):
        check(make_item(AnswerKind.CODE, "x"), "def f(): pass")
