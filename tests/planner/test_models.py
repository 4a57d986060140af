"""The dequantised-model cache: written whole or not at all, and never in the way of a load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conductor_planner.models import COMPLETE_MARKER, _write_cache


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
