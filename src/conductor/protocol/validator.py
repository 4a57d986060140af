"""Strict validation of a parsed plan, and the fallback plan used when validation fails."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conductor.protocol.examples import copies_an_example
from conductor.protocol.parser import ParsedLists
from conductor.workflow import ALL, AccessEntry, Plan, PlanStep

MAX_SUBTASK_CHARS = 8_000
FALLBACK_SUBTASK = "Answer the question."


@dataclass(frozen=True)
class Validation:
    plan: Plan | None
    errors: list[str] = field(default_factory=list)
    stop: bool = False  # a re-planning round wrote three empty lists

    @property
    def valid(self) -> bool:
        return not self.errors


def validate_plan(
    parsed: ParsedLists,
    *,
    pool_size: int,
    max_steps: int,
    conductor_id: int | None = None,
    allow_stop: bool = False,
    examples_shown: bool = False,
) -> Validation:
    """Check ids in the pool, 1..max_steps steps, equal lengths, access only to earlier steps.

    ``conductor_id`` is the pool id of the Conductor itself when recursion is offered; it may
    only be the last step, after at least one worker step. ``allow_stop`` accepts three empty
    lists (the Conductor ending a recursion round). ``examples_shown``: the prompt carried the
    few-shot examples, and a subtask copied from them is refused (it is not a plan for this
    question; the fallback sends the question as asked).
    """
    ids, subtasks, access = parsed.model_id, parsed.subtasks, parsed.access_list
    lengths = {len(ids), len(subtasks), len(access)}
    if len(lengths) != 1:
        return Validation(
            None,
            [
                f"lists differ in length: model_id {len(ids)}, subtasks {len(subtasks)}, "
                f"access_list {len(access)}"
            ],
        )
    count = len(ids)
    if count == 0:
        if allow_stop:
            return Validation(None, stop=True)
        return Validation(None, ["the plan has no steps"])
    if count > max_steps:
        return Validation(None, [f"{count} steps, at most {max_steps} allowed"])

    errors: list[str] = []
    steps = []
    for index in range(count):
        model_id = _check_model_id(ids[index], index, count, pool_size, conductor_id, errors)
        subtask = _check_subtask(subtasks[index], index, errors)
        if subtask is not None and examples_shown and copies_an_example(subtask):
            errors.append(f"step {index}: subtask copied from the prompt's examples: {subtask!r}")
            subtask = None
        entries = _check_access(access[index], index, errors)
        if model_id is not None and subtask is not None and entries is not None:
            steps.append(PlanStep(model_id=model_id, subtask=subtask, access_list=entries))
    if errors:
        return Validation(None, errors)
    return Validation(Plan(steps=tuple(steps)))


def _check_model_id(
    value: Any,
    index: int,
    count: int,
    pool_size: int,
    conductor_id: int | None,
    errors: list[str],
) -> int | None:
    if not isinstance(value, int) or isinstance(value, bool):
        errors.append(f"step {index}: model_id {value!r} is not an integer")
        return None
    if not 0 <= value < pool_size:
        errors.append(f"step {index}: model_id {value} is not in the pool (0..{pool_size - 1})")
        return None
    if value == conductor_id and (index != count - 1 or index == 0):
        errors.append(
            f"step {index}: the Conductor (model {value}) may only be the last step, "
            "after at least one other step"
        )
        return None
    return value


def _check_subtask(value: Any, index: int, errors: list[str]) -> str | None:
    if not isinstance(value, str) or not value.strip():
        errors.append(f"step {index}: subtask must be non-empty text")
        return None
    if len(value) > MAX_SUBTASK_CHARS:
        errors.append(f"step {index}: subtask longer than {MAX_SUBTASK_CHARS} characters")
        return None
    return value.strip()


def _check_access(value: Any, index: int, errors: list[str]) -> tuple[AccessEntry, ...] | None:
    if not isinstance(value, list | tuple):
        errors.append(f"step {index}: access list {value!r} is not a list")
        return None
    if ALL in value:
        # ["all"] alone is the protocol; "all" next to numbers still means every earlier step.
        if all(e == ALL or (_is_index(e) and 0 <= e < index) for e in value):
            return (ALL,)
        errors.append(f"step {index}: access list {value!r} mixes 'all' with invalid entries")
        return None
    entries: list[int] = []
    for entry in value:
        if not _is_index(entry):
            errors.append(f"step {index}: access entry {entry!r} is not a step number or 'all'")
            return None
        if not 0 <= entry < index:
            errors.append(f"step {index}: access entry {entry} is not an earlier step")
            return None
        if entry not in entries:
            entries.append(entry)
    return tuple(sorted(entries))


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def fallback_plan(model_id: int) -> Plan:
    """One step on a known-good worker with the question itself: used for invalid output."""
    return Plan(steps=(PlanStep(model_id=model_id, subtask=FALLBACK_SUBTASK),))
