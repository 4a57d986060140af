"""Operator-defined variants (CONDUCTOR_VARIANTS_FILE) next to the built-in ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.errors import ConfigurationError
from conductor.variants import BUILTIN_VARIANTS
from conductor_adapters.settings import Settings, load_variants
from conductor_adapters.store.runs import SubmitRequest


def test_a_variants_file_adds_variants_and_may_replace_a_builtin(tmp_path: Path) -> None:
    path = tmp_path / "variants.yaml"
    path.write_text(
        "variants:\n"
        "  conductor-fast: {max_steps: 2, parallel: false, description: Two steps.}\n"
        "  conductor-mini: {max_steps: 1, planner_max_tokens: 128}\n"
    )
    variants = load_variants(Settings(variants_file=path, default_variant="conductor-fast"))

    assert set(variants) == {"conductor-mini", "conductor-ultra", "conductor-fast"}
    assert variants["conductor-fast"].max_steps == 2
    assert not variants["conductor-fast"].parallel
    assert variants["conductor-mini"].planner_max_tokens == 128


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("variants:\n  bad: {max_steps: 9}\n", "bad: max_steps"),
        ("variants:\n  bad: {max_steps: 1, colour: red}\n", "bad: colour"),
        ("workers: {}\n", "'variants' mapping"),
        ("variants: [\n", "variants file"),
        ("variants:\n  a: {max_steps: 1}\n  a: {max_steps: 2}\n", "found 'a' a second time"),
        ("variants:\n  bad: {max_steps: true}\n", "bad: max_steps"),
        ("variants:\n  bad: {max_steps: '5'}\n", "bad: max_steps"),
        ("variants:\n  bad: {max_steps: 2, parallel: 'no'}\n", "bad: parallel"),
        ("variants:\n  bad: 3\n", "bad: expected a mapping"),
    ],
)
def test_a_bad_profiles_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "variants.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=message):
        load_variants(Settings(variants_file=path))


def test_the_default_variant_must_exist() -> None:
    with pytest.raises(ConfigurationError, match="CONDUCTOR_DEFAULT_VARIANT 'nope'"):
        load_variants(Settings(default_variant="nope"))


def test_files_and_variables_named_before_the_rename_still_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a file with the old "profiles:" key, named by the old variable
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n  conductor-fast: {max_steps: 2}\n")
    monkeypatch.setenv("CONDUCTOR_PROFILES_FILE", str(path))

    variants = load_variants(Settings())

    assert variants["conductor-fast"].max_steps == 2


def test_a_run_submitted_before_the_rename_still_loads() -> None:
    stored = {
        "question": "What is 2 + 2?",
        "profile": BUILTIN_VARIANTS["conductor-mini"].model_dump(mode="json"),
        "tenant": "acme",
    }

    request = SubmitRequest.model_validate(stored)

    assert request.variant == BUILTIN_VARIANTS["conductor-mini"]
