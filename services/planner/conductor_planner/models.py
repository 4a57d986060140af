"""Where the transformers planner and the trainer load a model from.

A GGUF file (``builtin:smollm2`` is one) is dequantised by transformers as it loads, which is
slow: about 25 s for SmolLM2-135M on 2 cores, most of it transformers and gguf-py parsing the
file in Python, not the arithmetic. The first load therefore writes the dequantised model as an
ordinary checkpoint under ``$XDG_CACHE_HOME/conductor/transformers/`` (float32, about 540 MB for
SmolLM2-135M) and every later load reads that instead (a few seconds). The cache is keyed by the
file's path, size and modification time and by the transformers version; where it cannot be
written (a read-only filesystem), the model is used as loaded and a warning says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor.errors import ConfigurationError, ModelNotFoundError
from conductor.pool import BUILTIN_SMOLLM2
from conductor.ports import PromptForm
from conductor_adapters.settings import default_cache_dir, file_cache_key

log = logging.getLogger(__name__)

# Written last into a cached checkpoint: a directory without it is an interrupted write.
COMPLETE_MARKER = "conductor-complete"
# Written by training into its checkpoints: the form of the prompts the model was trained on,
# so that it is served the same way (a model trained without the few-shot examples plans worse
# with them, and every prompt token costs time).
PROMPT_FORM_FILE = "conductor_prompt.json"


@dataclass(frozen=True)
class ModelSource:
    """Where transformers loads a model from: a directory or hub id, plus a GGUF file in it."""

    path: str
    gguf_file: str | None = None

    @property
    def name(self) -> str:
        return self.gguf_file or Path(self.path).name or self.path

    def load_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_model(model: str | None) -> ModelSource:
    """``builtin:smollm2`` (also when unset), a GGUF file, a checkpoint directory or a hub id."""
    if model is None or model == BUILTIN_SMOLLM2:
        from conductor_adapters.llamacpp import smollm2_gguf_path

        gguf = smollm2_gguf_path()
        return ModelSource(str(gguf.parent), gguf.name)
    path = Path(model).expanduser()
    if path.is_dir():
        return ModelSource(str(path))
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(
                f"planner model {path} is a file but not a GGUF file: name a checkpoint directory "
                "(written by save_pretrained), a .gguf file or a hub id"
            )
        return ModelSource(str(path.parent), path.name)
    if path.suffix == ".gguf" or path.is_absolute() or model.startswith((".", "~")):
        raise ModelNotFoundError(f"planner model not found: {path}")
    return ModelSource(model)  # a hub id, e.g. "org/name"


def prompt_form_of(source: ModelSource, *, default: PromptForm = PromptForm.FULL) -> PromptForm:
    """The prompt form ``source`` was trained on, as its training wrote in its checkpoint, else
    ``default`` (a model no Conductor training wrote). A checkpoint written before the compact
    form records only ``few_shot_examples``: false there is the SHORT form."""
    path = Path(source.path) / PROMPT_FORM_FILE
    if source.gguf_file or not path.is_file():
        return default
    forms = ", ".join(repr(f.value) for f in PromptForm)
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        if "form" in recorded:
            return PromptForm(recorded["form"])
        examples = recorded["few_shot_examples"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(
            f'{path}: not a prompt form ({exc!r}); it should read {{"form": ...}} with one of '
            f"{forms}"
        ) from exc
    if not isinstance(examples, bool):
        raise ConfigurationError(
            f"{path}: few_shot_examples must be true or false, not {examples!r}"
        )
    return PromptForm.FULL if examples else PromptForm.SHORT


def write_prompt_form(
    directory: Path, *, form: PromptForm, reward_cost_weight: float | None = None
) -> None:
    """Records in a checkpoint directory the prompt form its model was trained on, and the
    cost weight of the reward it was trained with (GRPO's; None before GRPO).
    ``few_shot_examples`` is kept for readers older than ``form``."""
    recorded: dict[str, object] = {"form": form.value, "few_shot_examples": form.examples}
    if reward_cost_weight is not None:
        recorded["reward_cost_weight"] = reward_cost_weight
    (directory / PROMPT_FORM_FILE).write_text(json.dumps(recorded) + "\n", encoding="utf-8")


def load_pretrained(source: ModelSource, *, dtype: Any) -> tuple[Any, Any]:
    """(tokenizer, causal LM) from ``source``; a GGUF file through its dequantised cache."""
    import transformers

    if not source.gguf_file:
        return _load(transformers, source.path, {}, dtype)
    cached = _cache_dir(source, transformers)
    if not (cached / COMPLETE_MARKER).exists():
        log.info("dequantising %s once; later loads read %s", source.gguf_file, cached)
        import torch

        tokenizer, model = _load(transformers, source.path, source.load_kwargs(), torch.float32)
        unmark_gguf(model)
        if not _write_cache(cached, tokenizer, model):
            return tokenizer, model.to(dtype)
    return _load(transformers, str(cached), {}, dtype)


def unmark_gguf(model: Any) -> None:
    """A GGUF file's weights are dequantised as they load, but transformers still marks the
    model as quantized by "gguf": its Trainer would refuse to fine-tune it, and the mark would
    reach the checkpoint's config. Dropping it makes the model a plain one."""
    model.hf_quantizer = None
    model.is_quantized = False
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


def _load(transformers: Any, path: str, kwargs: dict[str, Any], dtype: Any) -> tuple[Any, Any]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, **kwargs)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    return tokenizer, model


def _cache_dir(source: ModelSource, transformers: Any) -> Path:
    gguf = (Path(source.path) / str(source.gguf_file)).resolve()
    key = file_cache_key(gguf, transformers.__version__)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return default_cache_dir() / "transformers" / f"{gguf.stem}-{digest}"


def _write_cache(cached: Path, tokenizer: Any, model: Any) -> bool:
    """Writes the checkpoint under a temporary name, then renames it: readers never see half of
    one. False when it cannot be written (and no other process has written it)."""
    staging: Path | None = None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{cached.name}-", dir=cached.parent))
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).touch()
        os.replace(staging, cached)
        return True
    except OSError as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if (cached / COMPLETE_MARKER).exists():  # another process wrote it first
            return True
        log.warning("cannot cache the dequantised model in %s (%s)", cached.parent, exc)
        return False
