"""Worker adapter for OpenAI and every server that copies its Chat Completions API.

One adapter covers api.openai.com, vLLM, llama.cpp's server and hosted gateways: they differ
only in base URL and whether a key is needed. The adapter makes exactly one HTTP call per
``complete``; retries, quotas and cost accounting belong to the gateway around it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import httpx

from conductor.chat import ChatMessage, Completion
from conductor.errors import ConfigurationError, WorkerUnavailable
from conductor.openai_wire import OpenAIChatClient
from conductor.pool import Provider, WorkerSpec

OPENAI_PROVIDERS = frozenset({Provider.OPENAI, Provider.OPENAI_COMPATIBLE})


class OpenAICompatibleWorker:
    """A ChatWorker that POSTs ``{base_url}/chat/completions`` and returns a Completion."""

    def __init__(
        self,
        *,
        name: str,
        model: str,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self._chat = OpenAIChatClient(
            base_url=base_url,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            client=client,
            provider=f"worker {name!r}",
        )

    @classmethod
    def from_spec(
        cls,
        spec: WorkerSpec,
        environ: Mapping[str, str] = os.environ,
        client: httpx.AsyncClient | None = None,
    ) -> OpenAICompatibleWorker:
        """Build from the pool entry; the key is read from the variable it names, here only."""
        if spec.provider not in OPENAI_PROVIDERS:
            raise ConfigurationError(
                f"worker {spec.name!r}: provider {spec.provider.value!r} does not speak the "
                "OpenAI wire format"
            )
        base_url = spec.resolved_base_url()
        if not base_url:
            raise ConfigurationError(f"worker {spec.name!r}: set base_url in the pool file")
        if httpx.URL(base_url).scheme not in ("http", "https"):
            raise ConfigurationError(
                f"worker {spec.name!r}: base_url {base_url!r} must start with http:// or https://"
            )
        api_key: str | None = None
        if spec.api_key_env:
            api_key = environ.get(spec.api_key_env) or None
            if api_key is None:
                raise WorkerUnavailable(
                    f"worker {spec.name!r}: environment variable {spec.api_key_env} is not set"
                )
        elif spec.provider is Provider.OPENAI:
            raise WorkerUnavailable(
                f"worker {spec.name!r}: provider 'openai' needs api_key_env in the pool file"
            )
        return cls(
            name=spec.name,
            model=spec.model,
            base_url=base_url,
            api_key=api_key,
            timeout_s=spec.timeout_s,
            client=client,
        )

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        return await self._chat.chat(messages, max_tokens=max_tokens, temperature=temperature)

    async def aclose(self) -> None:
        await self._chat.aclose()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"OpenAICompatibleWorker(name={self.name!r}, {self._chat!r})"
