"""Worker adapter for OpenAI and every server that copies its Chat Completions API.

One adapter covers api.openai.com, vLLM, llama.cpp's server and hosted gateways: they differ
only in base URL, whether a key is needed, and (api.openai.com only) ``max_completion_tokens``.
The wire format itself lives in ``conductor_adapters.openai_wire``, shared with the planner backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Completion, ToolUse
from conductor.pool import Provider, WorkerSpec
from conductor.streaming import StreamEvent
from conductor_adapters.openai_wire import OpenAIChatClient, wire_response_format
from conductor_gateway.providers.endpoint import HttpWorker


class OpenAICompatibleWorker(HttpWorker):
    """A ChatWorker that POSTs ``{base_url}/chat/completions``."""

    providers = frozenset({Provider.OPENAI, Provider.OPENAI_COMPATIBLE})
    wire_format = "OpenAI wire format"

    def __init__(self, *, max_tokens_field: str = "max_tokens", **endpoint: Any) -> None:
        self.max_tokens_field = max_tokens_field
        super().__init__(**endpoint)

    def configure(self, base_url: str, api_key: str | None) -> None:
        self._chat = OpenAIChatClient(
            base_url=base_url,
            model=self.model,
            api_key=api_key,
            timeout_s=self.timeout_s,
            client=self._client,
            provider=self.provider,
            max_tokens_field=self.max_tokens_field,
        )
        self.url = self._chat.url

    @classmethod
    def spec_options(cls, spec: WorkerSpec) -> dict[str, Any]:
        # api.openai.com's reasoning models refuse max_tokens; look-alikes may not know
        # the newer name.
        field = "max_completion_tokens" if spec.provider is Provider.OPENAI else "max_tokens"
        return {"max_tokens_field": field}

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        return await self._chat.chat(messages, max_tokens=max_tokens, temperature=temperature)

    async def complete_with_tools(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolUse,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        return await self._chat.chat(
            messages, max_tokens=max_tokens, temperature=temperature, tools=tools
        )

    async def complete_in_format(
        self,
        messages: Sequence[ChatMessage],
        answer_format: AnswerFormat,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        return await self._chat.chat(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            response_format=wire_response_format(answer_format),
        )

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        return self._chat.stream(messages, max_tokens=max_tokens, temperature=temperature)
