"""The llama.cpp prompt cache: which requests it keeps, where they run, how files are kept."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from conductor_adapters.llamacpp import (
    EngineOptions,
    LlamaCppEngine,
    PromptCache,
    _writable_dir,
    smollm2_gguf_path,
)


def _body(system: str | None, user: str = "Question: 2 + 2?") -> dict[str, Any]:
    messages = [{"role": "user", "content": user}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages, "max_tokens": 8, "temperature": 0.0}


class RecordingCache(PromptCache):
    """Slot actions recorded instead of sent; a save writes the file the engine would."""

    def __init__(self, directory: Path, *, succeed: bool = True, model_key: str = "m") -> None:
        super().__init__(directory, model_key=model_key, base_url="http://unused", api_key="k")
        self.actions: list[tuple[str, str]] = []
        self.succeed = succeed

    def _slot_action(self, action: str, filename: str) -> bool:
        self.actions.append((action, filename))
        if self.succeed and action == "save":
            (self.directory / filename).write_bytes(b"state")
        return self.succeed


def test_only_a_system_message_is_kept_and_its_file_names_the_model_and_the_text(
    tmp_path: Path,
) -> None:
    cache = RecordingCache(tmp_path)
    assert cache.file_name(_body(None)) is None
    name = cache.file_name(_body("You are the Conductor."))
    assert name is not None
    assert name.startswith("prefix-")
    assert name.endswith(".bin")
    assert cache.file_name(_body("You are the Conductor.", user="other")) == name
    assert cache.file_name(_body("You are the Conductor!")) != name
    other_model = RecordingCache(tmp_path, model_key="another model")
    assert other_model.file_name(_body("You are the Conductor.")) != name


class Runs:
    """The engine's runs a cache asks for: recorded, answered with nothing."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return {}


def test_a_new_prefix_is_computed_alone_in_the_cache_slot_and_saved(tmp_path: Path) -> None:
    cache, runs = RecordingCache(tmp_path), Runs()
    request = _body("system", user="Question: a tenant's private question?")

    sent = cache.prepare(request, runs)

    # the system message alone is computed in the cache slot and saved: never the question
    assert runs.bodies == [
        {
            "messages": [{"role": "system", "content": "system"}],
            "max_tokens": 1,
            "id_slot": PromptCache.SLOT,
        }
    ]
    name = cache.file_name(request)
    assert name is not None
    assert [action for action, _ in cache.actions] == ["save"]
    assert (tmp_path / name).read_bytes() == b"state"
    assert not list(tmp_path.glob("*.tmp"))  # written under a temporary name, then renamed
    # the request then runs in that slot; the next one with this system message is left alone
    assert sent == {**request, "id_slot": PromptCache.SLOT}
    assert cache.prepare(_body("system"), runs) == _body("system")
    assert len(runs.bodies) == 1


def test_a_kept_prefix_is_restored_in_the_next_process(tmp_path: Path) -> None:
    RecordingCache(tmp_path).prepare(_body("system"), Runs())
    second, runs = RecordingCache(tmp_path), Runs()

    sent = second.prepare(_body("system"), runs)

    assert second.actions == [("restore", second.file_name(sent))]
    assert runs.bodies == []
    assert sent["id_slot"] == PromptCache.SLOT


def test_a_file_that_cannot_be_restored_is_written_again(tmp_path: Path) -> None:
    cache, runs = RecordingCache(tmp_path, succeed=False), Runs()
    name = cache.file_name(_body("system"))
    assert name is not None
    (tmp_path / name).write_bytes(b"truncated")

    sent = cache.prepare(_body("system"), runs)

    assert [action for action, _ in cache.actions] == ["restore", "save"]
    assert len(runs.bodies) == 1
    assert sent["id_slot"] == PromptCache.SLOT


def test_a_cache_directory_that_cannot_be_made_turns_the_cache_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A read-only root filesystem (as containers often run) must cost the cache, not the engine.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING):
        assert _writable_dir(blocker / "llamacpp") is None
    assert "prompt cache off" in caplog.text
    assert _writable_dir(tmp_path / "made" / "here") == tmp_path / "made" / "here"
    assert (tmp_path / "made" / "here").is_dir()
    assert _writable_dir(None) is None


def test_only_the_most_recently_used_files_are_kept(tmp_path: Path) -> None:
    cache = RecordingCache(tmp_path)
    for i in range(PromptCache.KEEP_FILES + 3):
        old = tmp_path / f"prefix-{i:02d}.bin"
        old.write_bytes(b"")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    dead = tmp_path / "prefix-x.bin.123-abcd.tmp"
    dead.write_bytes(b"")
    os.utime(dead, (1_000_000, 1_000_000))

    cache.prepare(_body("system"), Runs())

    kept = sorted(p.name for p in tmp_path.iterdir())
    assert len(kept) == PromptCache.KEEP_FILES
    assert cache.file_name(_body("system")) in kept
    assert "prefix-00.bin" not in kept
    assert dead.name not in kept


@pytest.mark.model
async def test_a_second_engine_starts_from_the_first_ones_system_prompt(tmp_path: Path) -> None:
    options = EngineOptions(
        context_tokens=2048, parallel_slots=2, threads=1, prompt_cache_dir=tmp_path
    )
    system = "You are a helpful assistant. " * 40  # some hundred tokens of a stable prefix
    body = _body(system)
    first = LlamaCppEngine(smollm2_gguf_path(), options)
    cold = await first.chat(body, keep_prefix=True)
    # computed once: the system message first (then saved), the request continuing from it
    assert cold["timings"]["cache_n"] > 200
    assert len(await asyncio.to_thread(lambda: list(tmp_path.glob("prefix-*.bin")))) == 1
    second = LlamaCppEngine(smollm2_gguf_path(), options)
    warm = await second.chat(_body(system, user="Question: 3 + 3?"), keep_prefix=True)
    assert warm["timings"]["cache_n"] > 200  # the system prompt, restored instead of recomputed
    assert warm["choices"][0]["message"]["content"]
