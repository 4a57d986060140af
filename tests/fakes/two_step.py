"""A two-step workflow for process tests: the fake Conductor plans "solve, then check with
everything", the fake workers answer as their subtask says."""

from __future__ import annotations

from typing import Any

SOLVED = "solved: 2 + 2 = 4"
CHECKED = "checked: the answer is 4"
# Variables of the caller's environment that would change what a started process does.
CALLER_SETTINGS = (
    "CONDUCTOR_BROKER_URL",
    "CONDUCTOR_REDIS_URL",
    "CONDUCTOR_REDIS_PREFIX",
    "CONDUCTOR_DATABASE_URL",
    "CONDUCTOR_POOL_FILE",
    "CONDUCTOR_PROFILES_FILE",
    "CONDUCTOR_VARIANTS_FILE",
    "CONDUCTOR_PLANNER_ADDR",
    "CONDUCTOR_PLANNER_BACKEND",
)


def plan_responder(messages: list[dict[str, Any]]) -> str:
    """The Conductor: solve with worker 0, then have worker 1 check with everything."""
    return (
        'Two steps.\nmodel_id = [0, 1]\nsubtasks = ["Solve it.", "Check the answer."]\n'
        'access_list = [[], ["all"]]'
    )


def worker_responder(messages: list[dict[str, Any]]) -> str:
    """A worker: checks when its subtask says so, else solves."""
    asked = "\n".join(str(m.get("content", "")) for m in messages)
    return CHECKED if "Check the answer." in asked else SOLVED
