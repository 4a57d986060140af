"""Planner backend for any OpenAI-compatible endpoint.

Runs the Conductor behind a ``vllm serve`` sidecar or a llama.cpp server, or uses a hosted
model as a prompted Conductor. With ``structured=True`` the endpoint is asked for JSON that
matches the plan schema (constrained decoding on vLLM and llama.cpp, strict structured outputs
on OpenAI), so the plan arrives as one JSON object instead of reasoning plus Python lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from conductor.chat import ChatMessage, Completion
from conductor.ports import PlanFormat, PromptForm
from conductor_adapters.openai_wire import OpenAIChatClient

SCHEMA_NAME = "conductor_plan"


class OpenAIPlannerBackend:
    """A PlannerBackend calling ``{base_url}/chat/completions``: one call per plan, no retries."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        structured: bool = False,
        timeout_s: float = 120.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.model = model
        self.structured = structured
        self.plan_format = PlanFormat.JSON if structured else PlanFormat.LISTS
        self.prompt_form = PromptForm.FULL  # a hosted model was not trained on our prompt
        self._chat = OpenAIChatClient(
            base_url=base_url,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            client=client,
            provider=f"planner backend {self.name!r} ({model})",
        )

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """The Conductor's raw text; JSON matching ``json_schema`` when structured."""
        response_format = None
        if self.structured and json_schema is not None:
            # strict: OpenAI then requires every property listed in "required" and
            # additionalProperties false; the planner's plan schema is written that way.
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "schema": json_schema, "strict": True},
            }
        return await self._chat.chat(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            response_format=response_format,
        )

    async def aclose(self) -> None:
        await self._chat.aclose()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"OpenAIPlannerBackend({self._chat!r}, structured={self.structured})"
