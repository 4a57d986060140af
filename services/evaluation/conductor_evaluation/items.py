"""Evaluation items: a question, its reference answer, and how an answer to it is checked.

Every suite (GSM8K, MATH-500, ARC, MMLU, HumanEval, MBPP, reasoning-gym generators, a user's
JSONL) is loaded into this one shape, so strategies, verifiers, the simulated provider and the
report never care where an item came from.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from conductor.pool import Domain

__all__ = ["AnswerKind", "Domain", "EvalItem", "Verdict", "choice_letter"]


class AnswerKind(StrEnum):
    """How a response is checked against ``EvalItem.answer``."""

    MATH = "math"  # mathematical equivalence (numbers, fractions, LaTeX expressions)
    CHOICE = "choice"  # multiple choice: the answer is a letter, A, B, C ...
    EXACT = "exact"  # the final answer equals the reference after normalisation
    REGEX = "regex"  # the response matches the reference regular expression
    CODE = "code"  # Python code that must pass ``tests`` in the sandbox
    REASONING_GYM = "reasoning-gym"  # scored by the reasoning-gym generator that made the item
    # A question of an outcome table: no reference; a workflow is judged by the recorded score
    # of the worker whose answer is final (conductor_evaluation.replay).
    REPLAY = "replay"


class EvalItem(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    suite: str
    id: str
    # What a strategy is asked: the question with its options and the answer format.
    question: str
    # The reference: a number or LaTeX (math), a letter (choice), a string (exact), a pattern
    # (regex), or the reasoning-gym answer. For code, the reference solution when known.
    answer: str
    kind: AnswerKind
    domain: Domain = Domain.GENERAL
    # Multiple choice: the option texts, in letter order.
    choices: tuple[str, ...] = ()
    # Code: a Python program run after the candidate code; it fails (non-zero exit) when the
    # candidate is wrong, e.g. asserts, or HumanEval's ``check(candidate)`` call.
    tests: str | None = None
    # Code: the function the tests call (HumanEval's entry point), when there is one.
    entry_point: str | None = None
    # Code: text put before the candidate when the candidate does not define ``entry_point``
    # itself (HumanEval's prompt: imports and the signature).
    code_prefix: str = ""
    # A response known to be right (code: a reference solution; regex: a matching answer).
    reference: str | None = None
    # How hard the item is, 0 (easiest) to 1 (hardest), from what its dataset says (MATH's
    # level, ARC's easy or challenge set, ...; see ``difficulty``); None when nothing does.
    # Only the simulated workers read it.
    difficulty: float | None = Field(default=None, ge=0, le=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        """Unique across suites: the cache and the report index results by it."""
        return f"{self.suite}/{self.id}"


def choice_letter(index: int) -> str:
    return chr(ord("A") + index)


class Verdict(BaseModel):
    """A verifier's judgement of one response."""

    model_config = ConfigDict(frozen=True)

    correct: bool
    # The answer found in the response ("18", "C", the code block), None when none was found.
    extracted: str | None = None
    # Why it was judged so, when that is not obvious: "no answer found", "timeout after 10 s".
    detail: str = ""
    # 0 to 1 where the judgement is a recorded score (a replayed worker's, fractional where its
    # source scored a share of sampled answers); None: ``correct`` says it all.
    score: float | None = Field(default=None, ge=0, le=1)
