"""The dequantised-model cache: written whole or not at all, and never in the way of a load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conductor.errors import ConfigurationError
from conductor.ports import PromptForm
from conductor_planner.models import (
    COMPLETE_MARKER,
    PROMPT_FORM_FILE,
    ModelSource,
    _write_cache,
    prompt_form_of,
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


@pytest.mark.parametrize("form", list(PromptForm))
def test_a_checkpoint_is_served_with_the_prompt_form_it_was_trained_on(
    tmp_path: Path, form: PromptForm
) -> None:
    write_prompt_form(tmp_path, form=form)
    for default in PromptForm:
        assert prompt_form_of(ModelSource(str(tmp_path)), default=default) is form


@pytest.mark.parametrize(
    ("recorded", "form"), [("true", PromptForm.FULL), ("false", PromptForm.SHORT)]
)
def test_a_checkpoint_written_before_the_compact_form_keeps_its_form(
    tmp_path: Path, recorded: str, form: PromptForm
) -> None:
    # Such a checkpoint records only whether its prompts carried the examples; without them
    # it was trained on the rules in full.
    (tmp_path / PROMPT_FORM_FILE).write_text(f'{{"few_shot_examples": {recorded}}}')
    assert prompt_form_of(ModelSource(str(tmp_path))) is form


def test_a_model_no_training_wrote_gets_the_default_prompt_form(tmp_path: Path) -> None:
    (tmp_path / PROMPT_FORM_FILE).write_text('{"form": "compact", "few_shot_examples": false}')
    gguf = ModelSource(str(tmp_path), "model.gguf")  # a GGUF file is never a trained checkpoint
    assert prompt_form_of(gguf) is PromptForm.FULL
    elsewhere = ModelSource(str(tmp_path / "elsewhere"))
    assert prompt_form_of(elsewhere, default=PromptForm.COMPACT) is PromptForm.COMPACT
    assert prompt_form_of(ModelSource("org/name")) is PromptForm.FULL


@pytest.mark.parametrize(
    "text",
    ["{", '{"examples": false}', '{"few_shot_examples": "no"}', '{"form": "tiny"}', "[]"],
)
def test_a_broken_prompt_form_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / PROMPT_FORM_FILE).write_text(text)
    with pytest.raises(ConfigurationError, match=PROMPT_FORM_FILE):
        prompt_form_of(ModelSource(str(tmp_path)))
