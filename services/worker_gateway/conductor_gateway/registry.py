"""Builds the callable workers of a pool: one adapter per available worker spec."""

from __future__ import annotations

import os
from collections.abc import Mapping

from conductor.llamacpp import EngineOptions, get_engine
from conductor.pool import Pool, Provider, WorkerSpec
from conductor.ports import ChatWorker
from conductor_gateway.adapters.anthropic import AnthropicWorker
from conductor_gateway.adapters.gemini import GeminiWorker
from conductor_gateway.adapters.llamacpp import LlamaCppWorker
from conductor_gateway.adapters.openai import OpenAICompatibleWorker
from conductor_gateway.adapters.sim import SimWorker


def build_worker(
    spec: WorkerSpec,
    engine_options: EngineOptions | None = None,
    environ: Mapping[str, str] = os.environ,
) -> ChatWorker:
    match spec.provider:
        case Provider.LLAMACPP:
            return LlamaCppWorker(
                spec.name, get_engine(spec.model, engine_options or EngineOptions())
            )
        case Provider.OPENAI | Provider.OPENAI_COMPATIBLE:
            return OpenAICompatibleWorker.from_spec(spec, environ)
        case Provider.ANTHROPIC:
            return AnthropicWorker.from_spec(spec, environ)
        case Provider.GEMINI:
            return GeminiWorker.from_spec(spec, environ)
        case Provider.SIM:
            return SimWorker.from_spec(spec)


def build_workers(
    pool: Pool,
    engine_options: EngineOptions | None = None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, ChatWorker]:
    """Clients for the workers that can be called here; the others are left out, not faked."""
    return {
        spec.name: build_worker(spec, engine_options, environ) for spec in pool.available(environ)
    }
