"""Answer verifiers: is a response to an ``EvalItem`` right?

They score evaluation runs and will be the reward of reinforcement learning, so nothing a model
writes may crash or hang them. math-verify (sympy), reasoning-gym's scorers and a suite's regular
expression therefore run in checker processes under a hard time limit (``checkers``). Only the
end of a response is searched for the answer (``TAIL_CHARS``), which bounds the cost of the
in-process checks.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Sequence
from typing import Any

from conductor_evaluation.items import AnswerKind, EvalItem, Verdict, choice_letter
from conductor_evaluation.suites_olmo import last_boxed

TAIL_CHARS = 4000  # the answer is at the end; a longer tail only costs time
MAX_MATH_ANSWER_CHARS = 1000  # no real answer is longer, and sympy's cost grows with length


async def verify(item: EvalItem, response: str | None) -> Verdict:
    """Judge ``response``; model output never makes this raise, only bugs and bad setups do."""
    if item.kind is AnswerKind.REPLAY:
        raise ValueError(
            f"{item.key} is a question of an outcome table: it has no reference to check text "
            "against; a workflow on it is judged by its final worker's recorded score "
            "(conductor_evaluation.replay.replay_verdict)"
        )
    if response is None or not response.strip():
        return Verdict(correct=False, detail="no response")
    if item.kind is AnswerKind.CODE:
        from conductor_evaluation.code_check import check_code  # the sandbox, only when needed

        return await check_code(item, response)
    if item.kind in (AnswerKind.CHOICE, AnswerKind.EXACT):
        return check(item, response)  # linear-time string work on the tail: no process needed
    from conductor_evaluation.checkers import run_check

    return await run_check(item, response)


def check(item: EvalItem, response: str) -> Verdict:
    """Judge a non-code ``response`` in this process, with no time limit (see ``verify``)."""
    match item.kind:
        case AnswerKind.MATH:
            return check_math(item.answer, response)
        case AnswerKind.CHOICE:
            return check_choice(item.answer, response, item.choices)
        case AnswerKind.EXACT:
            return check_exact(item.answer, response)
        case AnswerKind.REGEX:
            return check_regex(item.answer, response)
        case AnswerKind.REASONING_GYM:
            return check_reasoning_gym(item, response)
    raise ValueError(f"{item.key}: {item.kind} answers are checked by verify() only")


# --- text helpers ------------------------------------------------------------------------------

_WRAPPERS = " \t\r\n*`$\"'\u2018\u2019\u201c\u201d"  # markdown bold/code, dollars, quotes


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = deque(pattern.finditer(text), maxlen=1)
    return last[0] if last else None


def _after_last(pattern: re.Pattern[str], text: str) -> str | None:
    """What follows the last match: the rest of its line, or the lines below when that is empty
    ("Answer:\\n42")."""
    last = _last_match(pattern, text)
    if last is None:
        return None
    rest = text[last.end() :]
    return rest.split("\n", 1)[0].strip() or rest.strip() or None


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _unwrap(text: str) -> str:
    """Without surrounding markdown, quotes, dollars, trailing periods or a whole ``\\boxed{}``
    (a few rounds: "**\"Paris.\"**"; unbounded, "*.*.*." would take quadratic time)."""
    for _ in range(4):
        inner = text.strip(_WRAPPERS).rstrip(".")
        if inner.startswith("\\boxed{") and inner.endswith("}"):
            inner = last_boxed(inner) or inner
        if inner == text:
            break
        text = inner
    return text


def _normalise(text: str) -> str:
    return " ".join(_unwrap(text).split()).casefold()


# --- math --------------------------------------------------------------------------------------

_MATH_PHRASE = re.compile(r"answer\s*(?:is\s*:?|:)|####", re.IGNORECASE)
_DELIMITED = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# A number that ends where prose starts: "18.", "18 eggs", "$1,000, so" but not "2\sqrt{2}",
# "1/2", "3x" or "1, 2, 3".
_LEADING_NUMBER = re.compile(
    r"\\?\$?\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"
    r"(?=\s*\Z|[.,;:!?)*](?!\s*\d)|\s+[A-Za-z]{2,})"
)
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}|\\left|\\right|[$\s]")


def _bare(latex: str) -> str:
    return _TEXT_COMMANDS.sub(r"\1", latex).casefold()


def math_answer(text: str) -> str | None:
    """The answer a response states: its last ``\\boxed{}``, else what follows its last "answer
    is" / "Answer:" / "####"; None when it states none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    rest = _after_last(_MATH_PHRASE, text)
    if rest is None:
        return None
    rest = rest.lstrip(_WRAPPERS.replace("$", ""))
    if delimited := _DELIMITED.match(rest):
        return next(group for group in delimited.groups() if group is not None).strip()
    if number := _LEADING_NUMBER.match(rest):
        return number[1].replace(",", "")
    return _unwrap(rest)


def _parse_math(text: str) -> list[Any]:
    """math-verify's parse, thread-safe (no signal timeouts); bare LaTeX is read as math (it
    reads "1,000" as 1000 but "1,23" as a set)."""
    from math_verify import parse  # type: ignore[import-untyped]  # no type information

    if any(delimiter in text for delimiter in ("$", "\\(", "\\[")):
        return list(parse(text, parsing_timeout=None))
    return list(parse(f"${text}$", parsing_timeout=None) or parse(text, parsing_timeout=None))


def check_math(reference: str, response: str) -> Verdict:
    """Mathematical equivalence with math-verify: "0.5" is "\\frac{1}{2}", "\\sqrt{8}" is
    "2\\sqrt{2}"; a GSM8K number may carry "$", thousands commas or units."""
    from math_verify import verify as equivalent

    text = response[-TAIL_CHARS:]
    answer = math_answer(text)
    if answer is not None and len(answer) > MAX_MATH_ANSWER_CHARS:
        return Verdict(correct=False, extracted=answer[:100], detail="answer too long")
    if answer is not None and _bare(answer) == _bare(reference):
        return Verdict(correct=True, extracted=answer)  # "Evelyn" is "\text{Evelyn}"
    try:
        gold = _parse_math(reference)
        if answer is not None:
            target = _parse_math(answer)
        else:  # math-verify's own extraction: its anchors, else the last expression
            from math_verify import parse

            target = list(parse(text, parsing_timeout=None))
            answer = next((str(t) for t in reversed(target) if isinstance(t, str)), None)
        if not gold:
            return Verdict(correct=False, extracted=answer, detail="reference does not parse")
        if not target:
            return Verdict(correct=False, extracted=answer, detail="no mathematical answer found")
        correct = bool(equivalent(gold, target, timeout_seconds=None))
    except Exception as e:  # sympy on odd input: RecursionError, MemoryError, its own bugs
        return Verdict(correct=False, extracted=answer, detail=f"{type(e).__name__}: {e}")
    return Verdict(correct=correct, extracted=answer)


# --- multiple choice ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _choice_patterns(count: int) -> tuple[re.Pattern[str], ...]:
    """Highest priority first; each pattern's last match counts."""
    letters = f"A-{choice_letter(count - 1)}"
    low = letters.lower()
    return (
        re.compile(rf"\\boxed\{{\s*(?:\\text(?:bf)?\{{)?\s*\(?([{letters}])\b"),
        # "answer is (C)", "Answer: **C**", "option C", "the answer is (c)", "answer: c."
        re.compile(
            rf"(?i:\banswer\s*(?:is|:)|\boption)[:*\s]*(?:(?i:option)[:*\s]*)?"
            rf"(?:\(([{letters}{low}])\)|([{letters}])\b|([{low}])(?=\s*\Z|[.,;:!)*]))"
        ),
        re.compile(rf"\A\s*(?:\(([{letters}])\)|([{letters}])(?:[.):]|\s*\Z))"),
        re.compile(rf"\A\s*\(?([{low}])\)?\.?\s*\Z"),  # just "c"
        re.compile(rf"\(([{letters}])\)"),
    )


def extract_choice(response: str, choices: Sequence[str] = ()) -> str | None:
    """The option letter a response picks; falls back to the one option whose text it quotes."""
    count = min(len(choices) or 4, 26)
    head, tail = response[:TAIL_CHARS], response[-TAIL_CHARS:]
    for pattern in _choice_patterns(count):
        found = _last_match(pattern, head if pattern.pattern.startswith("\\A") else tail)
        if found is not None:
            return next(group for group in found.groups() if group).upper()
    quoted = [
        index
        for index, option in enumerate(choices)
        if option.strip()
        and re.search(rf"(?<!\w){re.escape(option.strip())}(?!\w)", tail, re.IGNORECASE)
    ]
    return choice_letter(quoted[0]) if len(quoted) == 1 else None


def check_choice(answer: str, response: str, choices: Sequence[str] = ()) -> Verdict:
    letter = extract_choice(response, choices)
    if letter is None:
        return Verdict(correct=False, detail="no option letter found")
    return Verdict(correct=letter == answer.strip().upper(), extracted=letter)


# --- exact, regex ------------------------------------------------------------------------------

_FINAL_ANSWER = re.compile(r"answer\s*(?:is\s*:?|:)", re.IGNORECASE)


def final_answer(text: str) -> str:
    """What follows the last "Answer:" / "answer is", else the last non-empty line."""
    return _after_last(_FINAL_ANSWER, text) or _last_line(text) or text


def check_exact(reference: str, response: str) -> Verdict:
    """Equality after normalising case, spacing, quotes, markdown and a trailing period."""
    extracted = final_answer(response[-TAIL_CHARS:])
    wanted = _normalise(reference)
    correct = _normalise(extracted) == wanted or _normalise(response) == wanted
    return Verdict(correct=correct, extracted=extracted)


def check_regex(pattern: str, response: str) -> Verdict:
    try:
        match = re.search(pattern, response, re.IGNORECASE | re.DOTALL)
    except re.error as e:  # the loader compiles it first; a hand-made item may not have been
        return Verdict(correct=False, detail=f"invalid pattern {pattern!r}: {e}")
    return Verdict(correct=match is not None, extracted=match[0] if match else None)


# --- reasoning-gym -----------------------------------------------------------------------------

_ANSWER_LINE = re.compile(r"answer\s*:", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def rg_answers(text: str) -> list[str]:
    """Readings of the final answer, best first: after the last "Answer:", its line and (grids,
    move lists) all the lines below; else the last <answer> tags, boxed, or the last line. Each
    also bare ("**42**." is 42)."""
    if (last := _last_match(_ANSWER_LINE, text)) is not None:
        rest = text[last.end() :]
        readings = [rest.split("\n", 1)[0].strip(), rest.strip()]
    elif tags := _ANSWER_TAG.findall(text):
        readings = [str(tags[-1]).strip()]
    elif (boxed := last_boxed(text)) is not None:
        readings = [boxed.strip()]
    else:
        readings = [_last_line(text) or ""]
    return [r for r in dict.fromkeys(readings + [_unwrap(r) for r in readings]) if r]


@functools.lru_cache(maxsize=64)
def _rg_dataset(generator: str, seed: int, size: int) -> Any:
    import reasoning_gym  # type: ignore[import-untyped]  # no type information

    return reasoning_gym.create_dataset(generator, seed=seed, size=size)


def check_reasoning_gym(item: EvalItem, response: str) -> Verdict:
    """The generator's own ``score_answer``; right only at exactly 1.0. Its partial credit (a near
    miss, the answer inside other text) is wrong, so a reward never pays for a near miss; and it
    can exceed 1.0 by rounding (spell_backward: a 9-letter word plus a stray letter scores
    1.0000000000000002)."""
    from conductor_evaluation.datasets import reasoning_gym_entry

    entry = reasoning_gym_entry(item)  # a bad item or version is a setup error: raise
    meta = item.metadata
    dataset = _rg_dataset(meta["generator"], meta["seed"], meta.get("size", meta["index"] + 1))
    readings = rg_answers(response[-TAIL_CHARS:])
    if not readings:
        return Verdict(correct=False, detail="no answer found")
    try:
        scores = [float(dataset.score_answer(reading, entry)) for reading in readings]
    except Exception as e:  # a generator's scorer choking on odd text
        return Verdict(correct=False, extracted=readings[0], detail=f"{type(e).__name__}: {e}")
    score = 1.0 if 1.0 in scores else max(scores)
    extracted = readings[scores.index(score)]
    detail = "" if score == 1.0 else f"score {score:.2f}"
    return Verdict(correct=score == 1.0, extracted=extracted, detail=detail)
