"""Builds the callable workers of a pool: one provider adapter per available worker spec."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from conductor.errors import ConfigurationError
from conductor.pool import Pool, Provider, WorkerSpec
from conductor.ports import ChatWorker
from conductor_adapters.llamacpp import EngineOptions, get_engine
from conductor_gateway.providers.anthropic import AnthropicWorker
from conductor_gateway.providers.gemini import GeminiWorker
from conductor_gateway.providers.llamacpp import LlamaCppWorker
from conductor_gateway.providers.openai import OpenAICompatibleWorker

WorkerFactory = Callable[[WorkerSpec], ChatWorker]


def build_worker(
    spec: WorkerSpec,
    engine_options: EngineOptions | None = None,
    environ: Mapping[str, str] = os.environ,
    providers: Mapping[Provider, WorkerFactory] | None = None,
) -> ChatWorker:
    """The adapter for one worker. ``providers`` supplies adapters built elsewhere: the
    simulated provider ``sim`` and the recorded one ``replay`` belong to the evaluation
    harness, which owns what they answer."""
    if providers and spec.provider in providers:
        return providers[spec.provider](spec)
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
            raise ConfigurationError(
                f"worker {spec.name!r} is simulated (provider 'sim'): this process was started "
                "without the simulated provider"
            )
        case Provider.REPLAY:
            raise ConfigurationError(
                f"worker {spec.name!r} replays recorded answers (provider 'replay'): this process "
                "was started without the replay provider"
            )


def build_workers(
    pool: Pool,
    engine_options: EngineOptions | None = None,
    environ: Mapping[str, str] = os.environ,
    providers: Mapping[Provider, WorkerFactory] | None = None,
) -> dict[str, ChatWorker]:
    """Clients for the workers that can be called here; the others are left out, not faked."""
    return {
        spec.name: build_worker(spec, engine_options, environ, providers)
        for spec in pool.available(environ)
    }
