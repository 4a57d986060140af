"""``POST /v1/responses/input_tokens``: how many tokens a response's input comes to, before it
is sent (``client.responses.input_tokens.count``), answered as ``{"object":
"response.input_tokens", "input_tokens": N}``.

The count is an estimate, as the gateway's quotas make it: about four characters a token and
four a message, the tools' schemas included, an image as 765. Workers of a pool have different
tokenizers, and a workflow reads the question several times over (the Conductor's prompt, then
each step's context): the count is of the input as sent, not of what a workflow will spend.
The request is checked as ``POST /v1/responses`` checks it: a model the key may use, input items
that are whole, and the same refusals.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from conductor.chat import ToolUse
from conductor_api.auth import CallerDep, ServiceDep
from conductor_api.errors import unknown_model
from conductor_api.openai_shared import check_passthrough
from conductor_api.request_policy import RESPONSES, refuse_unsupported
from conductor_api.responses_request import (
    check_reasoning,
    check_text,
    input_items,
    turns,
)
from conductor_api.responses_schemas import INPUT_SCHEMA, MAX_RESPONSE_ID_CHARS
from conductor_api.responses_store import continued
from conductor_api.schemas import ClientStr, Name, Text
from conductor_api.tools import tool_use

router = APIRouter(tags=["OpenAI-compatible"])
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
IMAGE_TOKENS = 765  # a 512x512 tile at high detail, as OpenAI counts it; the gateway's too


class InputTokensRequest(BaseModel):
    """The input of a ``responses.create`` request, to count; its other fields are checked as
    there."""

    model_config = ConfigDict(extra="forbid")

    model: Name | None = Field(default=None, description="A variant or a worker's name.")
    input: Annotated[Any, WithJsonSchema(INPUT_SCHEMA)] = None
    instructions: Text | None = None
    previous_response_id: ClientStr | None = Field(default=None, max_length=MAX_RESPONSE_ID_CHARS)
    tools: list[Any] | None = Field(default=None, max_length=128)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    text: Any = None
    reasoning: Any = None
    truncation: Any = None
    conversation: Any = None
    personality: ClientStr | None = Field(
        default=None, max_length=64, description="Accepted; no effect."
    )


class InputTokenCount(BaseModel):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


def estimate_input_tokens(messages: list[dict[str, Any]], tools: ToolUse | None) -> int:
    """About four characters a token, four tokens a message, an image as ``IMAGE_TOKENS``."""
    total = 0
    for message in messages:
        calls = message.get("tool_calls") or []
        chars = len(str(message.get("content", ""))) + sum(
            len(c["function"]["arguments"]) + len(c["function"]["name"]) for c in calls
        )
        images = len(message.get("images") or [])
        total += math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE + IMAGE_TOKENS * images
    if tools is not None:
        total += math.ceil(len(tools.model_dump_json()) / CHARS_PER_TOKEN)
    return total


@router.post("/v1/responses/input_tokens", response_model=InputTokenCount)
async def count_input_tokens(
    body: InputTokensRequest, service: ServiceDep, caller: CallerDep
) -> InputTokenCount:
    """The input's tokens (an estimate: see the module), for the model as a response would
    be sent to it; nothing is started or counted against the key's limits."""
    if body.model is not None and body.model in service.worker_names:
        check_passthrough(service, caller, body.model, None)
    elif body.model is not None and body.model not in service.variants:
        raise unknown_model(body.model)
    refuse_unsupported(body, {k: RESPONSES[k] for k in ("truncation", "conversation")})
    check_text(body.text)
    check_reasoning(body.reasoning)
    tools = tool_use(body.tools, body.tool_choice, body.parallel_tool_calls, nested=False)
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if body.previous_response_id is not None:
        messages += await continued(service, body.previous_response_id, caller.tenant)
    if body.input is not None:
        messages += turns(input_items(body.input))
    return InputTokenCount(input_tokens=estimate_input_tokens(messages, tools))
