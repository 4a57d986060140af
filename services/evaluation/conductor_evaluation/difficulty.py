"""How hard an evaluation item is, 0 (easiest) to 1 (hardest), from what its dataset records.

The simulated workers answer by an item-response curve over this number (``SimProfile.chance``),
so that which worker is worth calling depends on the item and not only on its domain: the thing
a router has to learn. The scales are coarse on purpose; each uses only what the dataset itself
says about the item:

- MATH-500: the level the dataset gives, 1 to 5 (0, 0.25, ..., 1).
- GSM8K: the calculation steps of the reference solution (its ``<<...>>`` annotations):
  one step 0, eight or more 1.
- ARC: the Easy set 0.3, the Challenge set 0.7 (the Challenge set is the questions that
  retrieval and word co-occurrence baselines answered wrongly).
- MMLU: the subject's level: elementary 0.2, high school 0.4, college and professional 0.7,
  other subjects 0.5.
- HumanEval and MBPP: the lines of code of the reference solution: two or fewer 0, twenty or
  more 1.

Items of other suites (reasoning-gym, a user's JSONL without a ``difficulty``) have none and
are treated as of average difficulty.
"""

from __future__ import annotations

ARC_EASY = 0.3
ARC_CHALLENGE = 0.7
MMLU_LEVELS = (
    ("elementary_", 0.2),
    ("high_school_", 0.4),
    ("college_", 0.7),
    ("professional_", 0.7),
)
MMLU_OTHER = 0.5


def _scaled(value: float, easiest: float, hardest: float) -> float:
    """``value`` mapped linearly from [easiest, hardest] onto [0, 1], clipped."""
    return min(1.0, max(0.0, (value - easiest) / (hardest - easiest)))


def math_level(level: str | int) -> float | None:
    """MATH's "Level 3" (or 3) -> 0.5; None when the level is not one of 1 to 5."""
    text = str(level).removeprefix("Level").strip()
    if not text.isdigit() or not 1 <= int(text) <= 5:
        return None
    return (int(text) - 1) / 4


def gsm8k_steps(solution: str) -> float:
    """GSM8K's reference solution -> its calculation steps, scaled."""
    return _scaled(solution.count("<<"), 1, 8)


def arc_set(suite: str) -> float:
    return ARC_CHALLENGE if suite == "arc-challenge" else ARC_EASY


def mmlu_subject(subject: str) -> float:
    for prefix, level in MMLU_LEVELS:
        if subject.startswith(prefix):
            return level
    return MMLU_OTHER


def code_lines(code: str) -> float:
    """A reference solution -> its lines of code (not blank, not comments), scaled."""
    lines = [
        line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    return _scaled(len(lines), 2, 20)
