"""Operator-defined variants (CONDUCTOR_PROFILES_FILE) next to the built-in ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.errors import ConfigurationError
from conductor.settings import Settings, load_variants


def test_a_profiles_file_adds_variants_and_may_replace_a_builtin(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text(
        "profiles:\n"
        "  conductor-fast: {max_steps: 2, parallel: false, description: Two steps.}\n"
        "  conductor-mini: {max_steps: 1, planner_max_tokens: 128}\n"
    )
    variants = load_variants(Settings(profiles_file=path, default_variant="conductor-fast"))

    assert set(variants) == {"conductor-mini", "conductor-ultra", "conductor-fast"}
    assert variants["conductor-fast"].max_steps == 2
    assert not variants["conductor-fast"].parallel
    assert variants["conductor-mini"].planner_max_tokens == 128


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("profiles:\n  bad: {max_steps: 9}\n", "bad: max_steps"),
        ("profiles:\n  bad: {max_steps: 1, colour: red}\n", "bad: colour"),
        ("workers: {}\n", "'profiles' mapping"),
        ("profiles: [\n", "profiles file"),
    ],
)
def test_a_bad_profiles_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=message):
        load_variants(Settings(profiles_file=path))


def test_the_default_variant_must_exist() -> None:
    with pytest.raises(ConfigurationError, match="CONDUCTOR_DEFAULT_VARIANT 'nope'"):
        load_variants(Settings(default_variant="nope"))
