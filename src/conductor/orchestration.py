"""The orchestration rules shared by every runtime (embedded executor, distributed aggregator).

Pure functions: whether a question is acceptable, which earlier steps a step may see, the chat
messages a worker receives, and the recursion budget. No I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from conductor.chat import ChatMessage
from conductor.errors import InvalidRequest
from conductor.workflow import ALL, AccessEntry, StepKind, StepRecord

CONDUCTOR_WORKER = "conductor"
MAX_QUESTION_CHARS = 100_000


def check_question(question: str) -> None:
    if not question.strip():
        raise InvalidRequest("the question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise InvalidRequest(f"the question is longer than {MAX_QUESTION_CHARS} characters")
    check_text("the question", question)


# A code point in the surrogate range is always lone in a Python str: JSON's escaped pairs
# (\ud83d\ude00) decode to the one character they stand for.
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_fault(text: str) -> str | None:
    """What makes a client's text unacceptable, as a noun phrase; None when nothing does.
    A NUL character: PostgreSQL cannot store one. A lone UTF-16 surrogate (``\\udfff`` in
    JSON): it has no UTF-8 form, so no store, provider or gRPC peer could take it. Refused,
    never altered behind the sender's back."""
    if "\x00" in text:
        return "a NUL character (\\u0000)"
    if not text.isascii() and _SURROGATE.search(text):
        return "a lone UTF-16 surrogate (\\ud800-\\udfff outside a pair)"
    return None


def check_text(what: str, text: str, *, param: str | None = None) -> None:
    """InvalidRequest naming ``what`` (and ``param``) when ``text_fault`` finds a fault."""
    fault = text_fault(text)
    if fault is not None:
        raise InvalidRequest(f"{what} contains {fault}", param=param)


def resolve_visible_steps(
    access_list: Sequence[AccessEntry],
    global_index: int,
    round_offset: int,
    earlier: Sequence[StepRecord],
) -> list[int]:
    """Global indices of the worker steps a step may see.

    Numbers in an access list are local to the step's round; ``"all"`` means every earlier
    worker step of the workflow, earlier rounds included. Conductor steps carry no answer and
    are never shown.
    """
    if ALL in access_list:
        wanted = set(range(global_index))
    else:
        wanted = {round_offset + entry for entry in access_list if isinstance(entry, int)}
    return sorted(s.index for s in earlier if s.index in wanted and s.kind is StepKind.WORKER)


def step_prompt(question: str, subtask: str, *, first_of_round: bool) -> str:
    """The user turn a worker gets: the first step of a round also gets the user's question."""
    if first_of_round:
        return f"Question: {question}\n\nYour task: {subtask}"
    return subtask


def build_messages(
    question: str, step: StepRecord, steps_by_index: dict[int, StepRecord]
) -> list[ChatMessage]:
    """Earlier visible steps as past chat turns (their subtask, their answer), then this one."""
    messages: list[ChatMessage] = []
    for index in step.visible_steps:
        seen = steps_by_index[index]
        if seen.output is None:
            raise ValueError(f"step {step.index} may see step {index}, which has no answer yet")
        first = _is_first_of_round(seen, steps_by_index)
        messages.append(
            ChatMessage(
                role="user", content=step_prompt(question, seen.subtask, first_of_round=first)
            )
        )
        messages.append(ChatMessage(role="assistant", content=seen.output))
    first = _is_first_of_round(step, steps_by_index)
    messages.append(
        ChatMessage(role="user", content=step_prompt(question, step.subtask, first_of_round=first))
    )
    return messages


def _is_first_of_round(step: StepRecord, steps_by_index: dict[int, StepRecord]) -> bool:
    return not any(s.round == step.round and s.index < step.index for s in steps_by_index.values())


def recursion_budget(first_plan_steps: int) -> int:
    """Most steps a workflow may run across rounds: fewer than twice the first plan's calls."""
    return 2 * first_plan_steps - 1


def round_limits(
    *, variant_max_steps: int, rounds_left: int, steps_left: int | None
) -> tuple[int, bool]:
    """Most steps the next plan may have, and whether its pool lists the Conductor.

    ``steps_left`` is None before the first plan. Offering the Conductor needs a recursion
    round left and room for a worker step, the Conductor step and one step of the next round;
    an offering round keeps one step back for that next round.
    """
    if steps_left is None:
        return variant_max_steps, rounds_left > 0 and variant_max_steps >= 2
    offer = rounds_left > 0 and steps_left >= 3
    return min(variant_max_steps, steps_left - 1 if offer else steps_left), offer
