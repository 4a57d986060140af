"""The dequantised-model cache: written whole or not at all, and never in the way of a load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conductor.errors import ConfigurationError
from conductor_planner.models import (
    COMPLETE_MARKER,
    PROMPT_FORM_FILE,
    ModelSource,
    _write_cache,
    prompt_examples_of,
    write_prompt_form,
)


class Saves:
    """Stands in for a transformers model or tokenizer: ``save_pretrained`` writes one file."""

    def __init__(self, name: str, *, fail: bool = False) -> None:
        self.name = name
        self.fail = fail

    def save_pretrained(self, directory: Path) -> None:
        if self.fail:
            raise OSError(28, "No space left on device")
        (Path(directory) / self.name).write_text("saved")


def test_the_checkpoint_appears_whole_under_its_name(tmp_path: Path) -> None:
    cached = tmp_path / "transformers" / "model-abc"
    assert _write_cache(cached, Saves("tokenizer.json"), Saves("model.safetensors"))
    assert sorted(p.name for p in cached.iterdir()) == [
        COMPLETE_MARKER,
        "model.safetensors",
        "tokenizer.json",
    ]
    assert [p.name for p in cached.parent.iterdir()] == ["model-abc"]  # no staging left


def test_a_failed_write_leaves_nothing_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cached = tmp_path / "transformers" / "model-abc"
    with caplog.at_level(logging.WARNING):
        assert not _write_cache(cached, Saves("tokenizer.json"), Saves("m", fail=True))
    assert list(cached.parent.iterdir()) == []
    assert "No space left on device" in caplog.text


def test_a_cache_that_cannot_be_made_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING):
        assert not _write_cache(blocker / "model-abc", Saves("t"), Saves("m"))
    assert "cannot cache the dequantised model" in caplog.text


def test_losing_the_race_to_another_process_is_fine(tmp_path: Path) -> None:
    cached = tmp_path / "model-abc"
    cached.mkdir()
    (cached / "model.safetensors").write_text("theirs")
    (cached / COMPLETE_MARKER).touch()
    assert _write_cache(cached, Saves("tokenizer.json"), Saves("model.safetensors"))
    assert (cached / "model.safetensors").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-abc"]


@pytest.mark.parametrize("examples", [True, False])
def test_a_checkpoint_is_served_with_the_prompt_form_it_was_trained_on(
    tmp_path: Path, examples: bool
) -> None:
    write_prompt_form(tmp_path, examples=examples)
    for default in (True, False):
        assert prompt_examples_of(ModelSource(str(tmp_path)), default=default) is examples


def test_a_model_no_training_wrote_gets_the_default_prompt_form(tmp_path: Path) -> None:
    (tmp_path / PROMPT_FORM_FILE).write_text('{"few_shot_examples": false}')
    gguf = ModelSource(str(tmp_path), "model.gguf")  # a GGUF file is never a trained checkpoint
    assert prompt_examples_of(gguf) is True
    assert prompt_examples_of(ModelSource(str(tmp_path / "elsewhere")), default=False) is False
    assert prompt_examples_of(ModelSource("org/name")) is True


@pytest.mark.parametrize("text", ["{", '{"examples": false}', '{"few_shot_examples": "no"}'])
def test_a_broken_prompt_form_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / PROMPT_FORM_FILE).write_text(text)
    with pytest.raises(ConfigurationError, match=PROMPT_FORM_FILE):
        prompt_examples_of(ModelSource(str(tmp_path)))
