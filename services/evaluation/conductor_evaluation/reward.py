"""The method's reward for one Conductor output, shared by GRPO rollouts and eval reports."""

from __future__ import annotations

INVALID, WRONG, RIGHT = 0.0, 0.5, 1.0


def method_reward(*, valid: bool, correct: bool) -> float:
    """0 when the plan cannot be parsed or is invalid, 0.5 when it ran to a wrong answer, 1
    when right: the reward the Conductor's method trains with (no length or cost term). An
    invalid served plan falls back to one step, so its answer may be right: the reward still
    counts it 0."""
    if not valid:
        return INVALID
    return RIGHT if correct else WRONG
