"""Planner backends behind one interface (conductor.ports.PlannerBackend), chosen by settings.

- ``llamacpp``: the embedded llama.cpp engine on a GGUF file (CPU), JSON-schema-constrained.
- ``openai``: any OpenAI-compatible endpoint (a ``vllm serve`` sidecar, a hosted model).
- ``transformers``: trained checkpoints (or a GGUF file) on Hugging Face transformers, CPU or
  GPU, written in the paper's lists form as in training; concurrent plans run in micro-batches.
  Extra ``transformers``.
- ``vllm``: vLLM's async engine in this process (GPU), JSON-schema-constrained. Extra ``vllm``.

The heavy libraries are imported only for the backend that is chosen; a missing extra, model or
GPU is a ConfigurationError that says what to do.
"""

from __future__ import annotations

import os

from conductor.errors import ConfigurationError
from conductor.ports import PlanFormat, PlannerBackend
from conductor_adapters.settings import Settings


def create_backend(settings: Settings) -> PlannerBackend:
    """The configured backend, its model loaded (blocking: ~1 s for llama.cpp, seconds to
    minutes for transformers and vLLM; servers call it in a thread)."""
    name = settings.planner_backend
    if name == "llamacpp":
        from conductor_adapters.llamacpp import EngineOptions, get_engine
        from conductor_planner.backends.llamacpp import LlamaCppPlannerBackend

        model = settings.planner_model or settings.local_model
        return LlamaCppPlannerBackend(get_engine(model, EngineOptions.from_settings(settings)))
    if name == "openai":
        from conductor_planner.backends.openai import OpenAIPlannerBackend

        if not settings.planner_base_url or not settings.planner_model:
            raise ConfigurationError(
                "planner backend 'openai' needs CONDUCTOR_PLANNER_BASE_URL and "
                "CONDUCTOR_PLANNER_MODEL"
            )
        api_key = None
        if settings.planner_api_key_env:
            api_key = os.environ.get(settings.planner_api_key_env)
            if not api_key:
                raise ConfigurationError(
                    f"planner backend 'openai': {settings.planner_api_key_env} is not set"
                )
        return OpenAIPlannerBackend(
            base_url=settings.planner_base_url,
            model=settings.planner_model,
            api_key=api_key,
            structured=settings.planner_structured,
        )
    if name == "transformers":
        from conductor_planner.backends.transformers import load_transformers_backend

        return load_transformers_backend(
            settings.planner_model,
            device=settings.planner_device,
            dtype=settings.planner_dtype,
            max_batch_size=settings.planner_max_batch_size,
        )
    if name == "vllm":
        from conductor_planner.backends.vllm import load_vllm_backend

        return load_vllm_backend(
            settings.planner_model,
            dtype=settings.planner_dtype,
            gpu_memory_utilization=settings.planner_gpu_memory_utilization,
            max_model_len=settings.planner_max_model_len,
            plan_format=PlanFormat.JSON if settings.planner_structured else PlanFormat.LISTS,
        )
    raise ConfigurationError(f"unknown planner backend {name!r}")
