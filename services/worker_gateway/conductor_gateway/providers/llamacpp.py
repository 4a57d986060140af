"""The local worker: a GGUF model on the embedded llama.cpp engine (no network, no cost)."""

from __future__ import annotations

from collections.abc import Sequence

from conductor.chat import ChatMessage, Completion
from conductor.streaming import WholeAnswerStream
from conductor_adapters.llamacpp import LlamaCppEngine


class LlamaCppWorker(WholeAnswerStream):
    def __init__(self, name: str, engine: LlamaCppEngine) -> None:
        self.name = name
        self.engine = engine

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        return await self.engine.complete(messages, max_tokens=max_tokens, temperature=temperature)

    async def aclose(self) -> None:
        """The engine is shared (planner, other workers on the same file) and stays loaded."""
