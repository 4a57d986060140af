"""Worker adapter for OpenAI and every server that copies its Chat Completions API.

One adapter covers api.openai.com, vLLM, llama.cpp's server and hosted gateways: they differ
only in base URL, whether a key is needed, and (api.openai.com only) ``max_completion_tokens``.
The adapter makes exactly one HTTP call per ``complete`` or ``stream``; retries, quotas and cost
accounting belong to the gateway around it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence

import httpx

from conductor.chat import ChatMessage, Completion
from conductor.errors import ConfigurationError
from conductor.openai_wire import OpenAIChatClient
from conductor.pool import Provider, WorkerSpec
from conductor.streaming import StreamEvent
from conductor_gateway.adapters.endpoint import resolve_endpoint

OPENAI_PROVIDERS = frozenset({Provider.OPENAI, Provider.OPENAI_COMPATIBLE})


class OpenAICompatibleWorker:
    """A ChatWorker that POSTs ``{base_url}/chat/completions``."""

    def __init__(
        self,
        *,
        name: str,
        model: str,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        client: httpx.AsyncClient | None = None,
        max_tokens_field: str = "max_tokens",
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
            max_tokens_field=max_tokens_field,
        )

    @classmethod
    def from_spec(
        cls,
        spec: WorkerSpec,
        environ: Mapping[str, str] = os.environ,
        client: httpx.AsyncClient | None = None,
    ) -> OpenAICompatibleWorker:
        if spec.provider not in OPENAI_PROVIDERS:
            raise ConfigurationError(
                f"worker {spec.name!r}: provider {spec.provider.value!r} does not speak the "
                "OpenAI wire format"
            )
        endpoint = resolve_endpoint(spec, environ)
        return cls(
            name=spec.name,
            model=spec.model,
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            timeout_s=spec.timeout_s,
            client=client,
            max_tokens_field=(
                "max_completion_tokens" if spec.provider is Provider.OPENAI else "max_tokens"
            ),
        )

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        return await self._chat.chat(messages, max_tokens=max_tokens, temperature=temperature)

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        return self._chat.stream(messages, max_tokens=max_tokens, temperature=temperature)

    async def aclose(self) -> None:
        await self._chat.aclose()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"OpenAICompatibleWorker(name={self.name!r}, {self._chat!r})"
