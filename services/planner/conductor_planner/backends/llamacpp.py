"""Planner backend on the embedded llama.cpp engine, with JSON-schema-constrained decoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conductor.chat import ChatMessage, Completion
from conductor.ports import PlanFormat, PromptForm
from conductor_adapters.llamacpp import LlamaCppEngine


class LlamaCppPlannerBackend:
    name = "llamacpp"
    # Constrained decoding makes every plan well-formed, whatever the model size.
    plan_format = PlanFormat.JSON
    prompt_form = PromptForm.FULL  # the GGUF models it runs were not trained on our prompt

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        # The system message (task and examples) is the same for every question: the engine
        # keeps its KV cache, so a new process's first plan does not recompute it.
        return await self.engine.complete(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            json_schema=json_schema,
            keep_prefix=True,
        )

    async def aclose(self) -> None:
        """The engine is shared with the local worker and lives as long as the process."""
