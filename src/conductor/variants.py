"""Variants as named variants: how much orchestration a request gets."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conductor.errors import ConfigurationError, InvalidRequest, validation_problems
from conductor.yaml_files import load_yaml_file

MAX_STEPS_LIMIT = 5  # the protocol's bound on steps per plan


class Variant(BaseModel):
    # Strict: `max_steps: true` or `"5"` in a variants file is a mistake to report, not 1 or 5.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str
    description: str = ""
    max_steps: int = Field(ge=1, le=MAX_STEPS_LIMIT)
    # Extra Conductor rounds a plan may trigger by naming the Conductor as its last step.
    recursion_rounds: int = Field(default=0, ge=0, le=3)
    # Run independent steps at once. Off runs steps one at a time in index order.
    parallel: bool = True
    planner_temperature: float = Field(default=0.3, ge=0, le=2)
    planner_max_tokens: int = Field(default=1024, gt=0)
    # One-step variants served by a learned router: the chance of a right answer it gives up
    # per USD per 1,000 questions saved. None: the router file's own.
    router_cost_weight: float | None = Field(default=None, ge=0)
    # Deadlines: a step (or a Conductor call) with no answer in step_timeout_s is sent again
    # once, then fails; a workflow still running after workflow_timeout_s fails.
    step_timeout_s: float = Field(default=600.0, gt=0)
    workflow_timeout_s: float = Field(default=1800.0, gt=0)


BUILTIN_VARIANTS: dict[str, Variant] = {
    p.name: p
    for p in (
        Variant(
            name="conductor-mini",
            description="One step: the Conductor routes the question to the best worker.",
            max_steps=1,
            recursion_rounds=0,
            planner_max_tokens=256,
        ),
        Variant(
            name="conductor-ultra",
            description="Up to 5 steps, independent steps in parallel, one round of recursion.",
            max_steps=MAX_STEPS_LIMIT,
            recursion_rounds=1,
            # Room for 5 steps: under a JSON schema each text's length is bounded to fit.
            planner_max_tokens=2048,
        ),
    )
}

DEFAULT_VARIANT = "conductor-ultra"


def load_variants_file(path: Path) -> dict[str, Variant]:
    """Operator-defined variants: ``variants: {NAME: {max_steps: ..., ...}}`` in YAML (files
    written before the rename say ``profiles:``, which is read the same). A name may replace a
    built-in one."""
    raw = load_yaml_file(path, "variants file") or {}
    entries = raw.get("variants", raw.get("profiles")) if isinstance(raw, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ConfigurationError(f"variants file {path}: expected a non-empty 'variants' mapping")
    variants = {}
    for name, fields in entries.items():
        if not isinstance(fields, dict):
            raise ConfigurationError(f"variants file {path}: {name}: expected a mapping")
        try:
            variants[str(name)] = Variant(name=str(name), **fields)
        except ValidationError as exc:
            problems = validation_problems(exc)
            raise ConfigurationError(f"variants file {path}: {name}: {problems}") from None
    return variants


def get_variant(name: str, extra: dict[str, Variant] | None = None) -> Variant:
    variants = {**BUILTIN_VARIANTS, **(extra or {})}
    try:
        return variants[name]
    except KeyError:
        known = ", ".join(sorted(variants))
        raise InvalidRequest(f"unknown variant {name!r} (known: {known})") from None
