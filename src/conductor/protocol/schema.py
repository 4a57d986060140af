"""JSON Schema of a plan for constrained decoding: a plan decoded under it always validates.

The schema encodes position-dependent rules with ``prefixItems``: step ``i`` may only access
steps ``0..i-1``, and the Conductor's own id may only be the last step of a plan that has at
least one worker step before it. In a recursion round (``allow_stop``) earlier rounds exist,
so even the first step may see them with ``["all"]``. Length limits keep a small model from
running away.
"""

from __future__ import annotations

from typing import Any

from conductor.workflow import ALL

# What one step's JSON costs besides its subtask text, and the object around the steps, in
# characters: {"model_id":N,"subtask":"","access_list":[...]} with a few access entries.
STEP_OVERHEAD_CHARS = 70
PLAN_OVERHEAD_CHARS = 40
MAX_TEXT_CHARS = 600
MIN_TEXT_CHARS = 40
# The reasoning is asked to be short: about twice the longest example's (151 characters). A small
# model that loops inside it otherwise writes up to the step limit, ~2 s of tokens on 2 cores.
MAX_REASONING_CHARS = 300


def text_limits(max_tokens: int, max_steps: int, *, reasoning: bool = True) -> tuple[int, int]:
    """Longest reasoning (0 for a plan without: ``reasoning`` false) and subtask the schema
    allows, so that the longest plan it admits fits in ``max_tokens``: a token spans at least
    one character, so bounding characters bounds tokens. Without this a small model that
    rambles up to every maxLength is cut off mid-JSON, and the output, though constrained, does
    not parse."""
    budget = max_tokens - PLAN_OVERHEAD_CHARS - STEP_OVERHEAD_CHARS * max_steps
    if not reasoning:
        return 0, max(MIN_TEXT_CHARS, min(MAX_TEXT_CHARS, budget // max(1, max_steps)))
    reasoning_chars = max(MIN_TEXT_CHARS, min(MAX_REASONING_CHARS, budget // 4))
    subtask = max(
        MIN_TEXT_CHARS, min(MAX_TEXT_CHARS, (budget - reasoning_chars) // max(1, max_steps))
    )
    return reasoning_chars, subtask


def plan_schema(
    *,
    worker_ids: list[int],
    max_steps: int,
    conductor_id: int | None = None,
    allow_stop: bool = False,
    max_subtask_chars: int = MAX_TEXT_CHARS,
    max_reasoning_chars: int = MAX_REASONING_CHARS,
) -> dict[str, Any]:
    """The JSON schema a plan's output must follow under constrained decoding: a ``reasoning``
    string (none where ``max_reasoning_chars`` is 0: the minimal prompt form) and the steps."""
    if not worker_ids:
        raise ValueError("a plan schema needs at least one worker id")
    earlier_rounds = allow_stop  # only a recursion round may stop, and only it has a past
    worker_steps = [
        _step_schema(i, worker_ids, max_subtask_chars, earlier_rounds) for i in range(max_steps)
    ]
    alternatives: list[dict[str, Any]] = [
        {
            "type": "array",
            "prefixItems": worker_steps,
            "minItems": 0 if allow_stop else 1,
            "maxItems": max_steps,
        }
    ]
    if conductor_id is not None:
        for workers_before in range(1, max_steps):
            conductor_step = _step_schema(
                workers_before, [conductor_id], max_subtask_chars, earlier_rounds
            )
            alternatives.append(
                {
                    "type": "array",
                    "prefixItems": [*worker_steps[:workers_before], conductor_step],
                    "minItems": workers_before + 1,
                    "maxItems": workers_before + 1,
                }
            )
    steps = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    properties: dict[str, Any] = {"steps": steps}
    if max_reasoning_chars > 0:
        reasoning = {"type": "string", "maxLength": max_reasoning_chars}
        properties = {"reasoning": reasoning, **properties}  # reasoning first: it comes first
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


_SEE_ALL = {"type": "array", "prefixItems": [{"const": ALL}], "minItems": 1, "maxItems": 1}
# Starts with a non-space: the validator refuses blank subtasks, so the schema must too.
_NOT_BLANK = "^\\S[\\s\\S]*$"


def _step_schema(
    index: int, model_ids: list[int], max_subtask_chars: int, earlier_rounds: bool
) -> dict[str, Any]:
    nothing: dict[str, Any] = {"type": "array", "maxItems": 0}
    if index == 0:
        access = {"anyOf": [nothing, _SEE_ALL]} if earlier_rounds else nothing
    else:
        numbers = {"type": "array", "items": {"enum": list(range(index))}, "maxItems": index}
        access = {"anyOf": [_SEE_ALL, numbers]}
    return {
        "type": "object",
        "properties": {
            "model_id": {"enum": model_ids},
            "subtask": {
                "type": "string",
                "minLength": 1,
                "maxLength": max_subtask_chars,
                "pattern": _NOT_BLANK,
            },
            "access_list": access,
        },
        "required": ["model_id", "subtask", "access_list"],
        "additionalProperties": False,
    }
