"""Four few-shot examples, written for this project (the paper's most damaging ablation is
removing them). They use a sample team of their own so they fit any pool the user has.

Subtasks refer to "the question" rather than restating it: a small Conductor copies example
subtasks verbatim, and a copied subtask must still point its worker at the user's question.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from conductor.workflow import ALL, Plan, PlanStep

EXAMPLE_TEAM = (
    "A careful mathematician: strong at step-by-step reasoning and arithmetic.",
    "A fast, cheap generalist: good at short factual answers and simple edits.",
    "An expert programmer: writes and reviews correct, efficient code.",
)


@dataclass(frozen=True)
class FewShotExample:
    question: str
    reasoning: str
    plan: Plan
    # Used instead of `plan` when a variant allows a single step (conductor-mini).
    routing_reasoning: str
    routing_plan: Plan


def _plan(*steps: tuple[int, str, tuple[int | str, ...]]) -> Plan:
    return Plan(steps=tuple(PlanStep(model_id=m, subtask=s, access_list=a) for m, s, a in steps))


EXAMPLES: tuple[FewShotExample, ...] = (
    FewShotExample(
        question=(
            "A shop sells pens at 3 for $4. How much do 27 pens cost, and how much is saved "
            "compared with buying them at $1.50 each?"
        ),
        reasoning=(
            "Arithmetic with two parts. The mathematician solves it, then checks its own work "
            "with the full solution in view."
        ),
        plan=_plan(
            (0, "Solve the problem in the question step by step and state the final answer.", ()),
            (
                0,
                "Check the solution above for mistakes and reply with the corrected final "
                "answer to the question.",
                (ALL,),
            ),
        ),
        routing_reasoning="Arithmetic: the mathematician is the best single choice.",
        routing_plan=_plan(
            (0, "Solve the problem in the question step by step and state the final answer.", ())
        ),
    ),
    FewShotExample(
        question=(
            "Write a Python function that returns the length of the longest strictly increasing "
            "subsequence of a list of integers, in O(n log n) time."
        ),
        reasoning=(
            "A coding task: first an algorithm, then the code, then a review. The programmer "
            "writes the code after seeing the algorithm; the review sees everything."
        ),
        plan=_plan(
            (
                0,
                "Describe an efficient algorithm for the task in the question, briefly argued.",
                (),
            ),
            (2, "Implement the algorithm above in Python, as the question asks.", (0,)),
            (
                2,
                "Review the code above against the question, fix any bug, and return only "
                "the final code.",
                (ALL,),
            ),
        ),
        routing_reasoning="A coding task: route it to the programmer.",
        routing_plan=_plan(
            (2, "Write the code the question asks for and return only the code.", ())
        ),
    ),
    FewShotExample(
        question=(
            "Which gas makes up most of Earth's atmosphere? (A) Oxygen (B) Nitrogen "
            "(C) Argon (D) Carbon dioxide"
        ),
        reasoning="A short factual multiple-choice question: one fast step is enough.",
        plan=_plan((1, "Answer with the letter of the correct option only.", ())),
        routing_reasoning="A short factual question: the generalist answers it.",
        routing_plan=_plan((1, "Answer with the letter of the correct option only.", ())),
    ),
    FewShotExample(
        question=(
            "Compare bubble sort and merge sort for sorting one million numbers, and recommend one."
        ),
        reasoning=(
            "Two independent analyses can run at the same time; a final step sees both and "
            "writes the recommendation."
        ),
        plan=_plan(
            (2, "Analyse the first option the question names: its costs and strengths.", ()),
            (0, "Analyse the second option the question names: its costs and strengths.", ()),
            (
                1,
                "Using the two analyses above, compare the options and recommend one in "
                "three sentences.",
                (0, 1),
            ),
        ),
        routing_reasoning="An algorithms question: the programmer knows both well.",
        routing_plan=_plan((2, "Compare the options the question names and recommend one.", ())),
    ),
)


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().rstrip(".!").casefold()


# Every subtask the examples show, in either form. A plan that carries one word for word was
# copied from the prompt, not written for the user's question: an untrained SmolLM2 answered
# the README's pens question with the multiple-choice example's "Answer with the letter of the
# correct option only.", and its worker then repeated the question.
_EXAMPLE_SUBTASKS = frozenset(
    _normalised(step.subtask)
    for example in EXAMPLES
    for plan in (example.plan, example.routing_plan)
    for step in plan.steps
)


# Near copies count too: the README's pens question once got "Analyse the first option the
# question name: its costs and strengths." (one letter off the example's). 0.9 of difflib's
# ratio is a letter or two in a sentence; the warm-ups' own subtasks score below 0.8.
NEAR_COPY_RATIO = 0.9


def copies_an_example(subtask: str) -> bool:
    """Whether ``subtask`` is one of the examples' subtasks, or all but a few letters of one
    (case, spacing and a final full stop aside)."""
    text = _normalised(subtask)
    if text in _EXAMPLE_SUBTASKS:
        return True
    matcher = difflib.SequenceMatcher(a=text)
    for example in _EXAMPLE_SUBTASKS:
        matcher.set_seq2(example)
        if matcher.real_quick_ratio() >= NEAR_COPY_RATIO and matcher.ratio() >= NEAR_COPY_RATIO:
            return True
    return False
