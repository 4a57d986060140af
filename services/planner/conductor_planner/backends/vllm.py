"""Planner backend on vLLM's in-process async engine (GPU only).

The Conductor checkpoint (``CONDUCTOR_PLANNER_MODEL``: a Hugging Face directory or hub id) is
loaded into ``vllm.AsyncLLMEngine`` (in current vLLM an alias of the v1 ``AsyncLLM``) in this
process when the backend is built. Each plan is one engine request; the engine schedules
concurrent requests into its own continuous batches, so there is no batcher or lock here.

- Prompt: the chat template of the engine's tokenizer with the generation prompt, sent as token
  ids (``prompt_token_ids``, as in the transformers backend), so the engine adds no second BOS.
- Output: ``PlanFormat.JSON`` by default: the planner's plan schema goes to vLLM's structured
  outputs, ``SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))`` in
  vLLM >= 0.11 and ``guided_decoding=GuidedDecodingParams(json=schema)`` before; which one is
  found by feature detection (``structured_output_kwargs``), not by version number.
  ``PlanFormat.LISTS`` (no constraint) serves a checkpoint trained on the lists form as trained.
- Sampling: the request's temperature (0 is greedy in vLLM) and max_tokens; text, finish reason
  and token counts come from the engine's final ``RequestOutput``.
- ``aclose`` shuts the engine down (its core process and GPU memory).

Needs the ``vllm`` extra and a CUDA GPU; without either, building it is a ConfigurationError.
CI has neither: there, only the import guard, the GPU check, the feature detection and the
request mapping (against a stand-in engine) are tested.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import ConfigurationError
from conductor.pool import BUILTIN_SMOLLM2
from conductor.ports import PlanFormat, PromptForm
from conductor_planner.backends.transformers import prompt_token_ids
from conductor_planner.models import ModelSource, prompt_form_of

INSTALL_HINT = "pip install 'conductor-orchestrator[vllm]'"
# SamplingParams keyword and parameter class for JSON-schema-constrained output, newest first.
STRUCTURED_OUTPUT_APIS = (
    ("structured_outputs", "StructuredOutputsParams"),  # vLLM >= 0.11
    ("guided_decoding", "GuidedDecodingParams"),  # vLLM 0.6 - 0.10
)


def import_vllm() -> ModuleType:
    """The vllm package, or a ConfigurationError that says how to install it."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise ConfigurationError(
            f"planner backend 'vllm' needs vLLM, which cannot be imported ({exc}). Install it on "
            f"a GPU machine with `{INSTALL_HINT}`, or use CONDUCTOR_PLANNER_BACKEND=transformers "
            "or llamacpp."
        ) from exc


def require_gpu() -> None:
    """vLLM's engine runs on a CUDA (or ROCm) GPU: fail clearly before it tries."""
    torch = importlib.import_module("torch")  # a dependency of vllm
    if not torch.cuda.is_available():
        raise ConfigurationError(
            "planner backend 'vllm' needs a GPU, and torch sees none. On a CPU machine use "
            "CONDUCTOR_PLANNER_BACKEND=transformers (trained checkpoints) or llamacpp (GGUF)."
        )


def structured_output_kwargs(sampling_params: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams keyword arguments that constrain the output to JSON matching ``schema``.

    ``sampling_params`` is the ``vllm.sampling_params`` module; the first API it has wins.
    Whitespace between JSON tokens is turned off where the class allows it: a small model
    otherwise spends tokens on runs of it.
    """
    for keyword, class_name in STRUCTURED_OUTPUT_APIS:
        params_class = getattr(sampling_params, class_name, None)
        if params_class is None:
            continue
        try:
            params = params_class(json=schema, disable_any_whitespace=True)
        except TypeError:  # a release without the option
            params = params_class(json=schema)
        return {keyword: params}
    raise ConfigurationError(
        "this vLLM release has neither StructuredOutputsParams nor GuidedDecodingParams, so it "
        f"cannot constrain plans to their schema; install a supported one with `{INSTALL_HINT}`"
    )


def load_vllm_backend(
    model: str | None,
    *,
    dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    plan_format: PlanFormat = PlanFormat.JSON,
) -> VLLMPlannerBackend:
    """Starts the engine with the model loaded (blocking: tens of seconds to minutes)."""
    if not model or model == BUILTIN_SMOLLM2:
        raise ConfigurationError(
            "planner backend 'vllm' needs CONDUCTOR_PLANNER_MODEL: a Hugging Face checkpoint "
            "directory or hub id (the built-in GGUF model runs on llamacpp or transformers)"
        )
    vllm = import_vllm()
    require_gpu()
    path = Path(model).expanduser()
    source = str(path.resolve()) if path.exists() else model
    args = vllm.AsyncEngineArgs(
        model=source,
        dtype=dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        disable_log_stats=True,
    )
    engine = vllm.AsyncLLMEngine.from_engine_args(args)
    return VLLMPlannerBackend(
        engine,
        importlib.import_module("vllm.sampling_params"),
        model_name=path.name if path.exists() else model,
        plan_format=plan_format,
        prompt_form=prompt_form_of(ModelSource(str(path))),  # FULL for a hub id
    )


class VLLMPlannerBackend:
    """A PlannerBackend on a running vLLM async engine; one engine request per plan."""

    name = "vllm"

    def __init__(
        self,
        engine: Any,
        sampling_params: Any,
        *,
        model_name: str,
        plan_format: PlanFormat = PlanFormat.JSON,
        prompt_form: PromptForm = PromptForm.FULL,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.plan_format = plan_format
        self.prompt_form = prompt_form
        self._sampling = sampling_params  # the vllm.sampling_params module
        self._tokenizer: Any = None

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """The Conductor's raw text: JSON matching ``json_schema`` in the JSON plan format."""
        ids = prompt_token_ids(await self._get_tokenizer(), messages)
        params = self.sampling_params(
            json_schema=json_schema, max_tokens=max_tokens, temperature=temperature
        )
        final: Any = None
        request_id = f"plan-{uuid.uuid4().hex}"
        async for output in self.engine.generate({"prompt_token_ids": ids}, params, request_id):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        choice = final.outputs[0]
        prompt_ids = getattr(final, "prompt_token_ids", None) or ids
        return Completion(
            text=choice.text,
            usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(choice.token_ids)),
            model=self.model_name,
            finish_reason=choice.finish_reason,
        )

    def sampling_params(
        self, *, json_schema: dict[str, Any] | None, max_tokens: int, temperature: float
    ) -> Any:
        """The request's ``SamplingParams``: constrained in the JSON format, final output only."""
        kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
        if json_schema is not None and self.plan_format is PlanFormat.JSON:
            kwargs.update(structured_output_kwargs(self._sampling, json_schema))
        output_kind = getattr(self._sampling, "RequestOutputKind", None)
        if output_kind is not None:  # one RequestOutput at the end, not one per token
            kwargs["output_kind"] = output_kind.FINAL_ONLY
        return self._sampling.SamplingParams(**kwargs)

    async def _get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            tokenizer = self.engine.get_tokenizer()  # a coroutine in older releases
            if inspect.isawaitable(tokenizer):
                tokenizer = await tokenizer
            self._tokenizer = tokenizer
        return self._tokenizer

    async def aclose(self) -> None:
        """Shuts the engine down: its core process exits and the GPU memory is freed."""
        shutdown = getattr(self.engine, "shutdown", None)
        if callable(shutdown):
            await asyncio.to_thread(shutdown)

    def __repr__(self) -> str:
        return f"VLLMPlannerBackend({self.model_name!r}, plan_format={self.plan_format.value})"
