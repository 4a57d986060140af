"""The local worker: a GGUF model on the embedded llama.cpp engine (no network, no cost)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from conductor.chat import ChatMessage, Completion
from conductor.llamacpp import LlamaCppEngine
from conductor.streaming import StreamEvent, one_delta_stream


class LlamaCppWorker:
    def __init__(self, name: str, engine: LlamaCppEngine) -> None:
        self.name = name
        self.engine = engine

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        return await self.engine.complete(messages, max_tokens=max_tokens, temperature=temperature)

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        # The embedded engine answers in one piece; a stream of one delta keeps the interface.
        completion = await self.complete(messages, max_tokens=max_tokens, temperature=temperature)
        async for event in one_delta_stream(completion):
            yield event

    async def aclose(self) -> None:
        """The engine is shared (planner, other workers on the same file) and stays loaded."""
