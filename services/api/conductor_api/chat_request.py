"""The chat completion request: every field of OpenAI's ``chat.completions.create``, each
honoured, accepted without effect, or refused unless it asks for nothing (``request_policy``
says which and why); a field the API does not know is refused (``extra="forbid"``: the error
handler names every one).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from conductor.orchestration import MAX_QUESTION_CHARS
from conductor_api.schemas import (
    MAX_LABELS,
    MAX_MESSAGES,
    ChatMessageIn,
    ClientStr,
    ConductorOptions,
    LabelValue,
    Name,
)

NO_EFFECT = "Accepted; no effect on the answer."
REFUSED = "Refused (400) unless null or its neutral value: Conductor cannot honour it."
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: ClientStr = Field(min_length=1, max_length=64)
    description: ClientStr | None = Field(default=None, max_length=MAX_QUESTION_CHARS)
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class TextFormat(BaseModel):
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    type: Literal["json_object"]


class JsonSchemaFormat(BaseModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = Field(default=False, strict=True)
    include_obfuscation: bool | None = Field(
        default=None, description="Accepted; chunks are never padded."
    )


class ChatCompletionRequest(BaseModel):
    """The OpenAI chat completion request. For a worker called directly, ``max_tokens`` (or
    ``max_completion_tokens``) bounds its answer within the pool file's bound, and
    ``temperature`` replaces its own; a workflow's steps keep the pool file's settings. The
    sampling hints (top_p, stop, seeds, penalties), identifiers and reasoning effort are
    accepted and have no effect; what Conductor cannot honour is refused unless it asks for
    nothing; an unknown field is refused."""

    model_config = ConfigDict(extra="forbid")

    model: Name = Field(description="A variant (e.g. conductor-ultra) or a worker's name.")
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1, strict=True, description="Only one choice is supported.")
    conductor: ConductorOptions | None = None
    metadata: dict[Name, LabelValue] | None = Field(default=None, max_length=MAX_LABELS)
    response_format: ResponseFormat | None = Field(
        default=None,
        description="json_object or json_schema: the answer is one JSON object (matching the "
        "schema), checked before it is returned.",
    )
    tools: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=128,
        description="Function tools, passed to a worker called directly whose wire format "
        "takes them, or to the step that writes a workflow's answer (on such a worker).",
    )
    tool_choice: str | dict[str, Any] | None = Field(
        default=None, description='"auto", "none", "required" or one function.'
    )
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    # Accepted, no effect on the answer.
    top_p: float | None = Field(
        default=None, ge=0, le=1, allow_inf_nan=False, description=NO_EFFECT
    )
    stop: Any = Field(default=None, description=f"A string or a list of them. {NO_EFFECT}")
    frequency_penalty: float | None = Field(
        default=None, ge=-2, le=2, allow_inf_nan=False, description=NO_EFFECT
    )
    presence_penalty: float | None = Field(
        default=None, ge=-2, le=2, allow_inf_nan=False, description=NO_EFFECT
    )
    seed: int | None = Field(default=None, strict=True, description=NO_EFFECT)
    user: ClientStr | None = Field(default=None, max_length=512, description=NO_EFFECT)
    safety_identifier: ClientStr | None = Field(default=None, max_length=512, description=NO_EFFECT)
    prompt_cache_key: ClientStr | None = Field(default=None, max_length=512, description=NO_EFFECT)
    store: bool | None = Field(
        default=None, strict=True, description="Accepted; every workflow is kept as a trace."
    )
    reasoning_effort: ReasoningEffort | None = Field(
        default=None, description="Accepted; each worker runs with the pool file's settings."
    )
    # Refused unless null or the value that asks for nothing (request_policy.CHAT).
    modalities: Any = Field(default=None, description='Only ["text"].')
    audio: Any = Field(default=None, description=REFUSED)
    web_search_options: Any = Field(default=None, description=REFUSED)
    prediction: Any = Field(default=None, description=REFUSED)
    logprobs: Any = Field(default=None, description="Only false.")
    top_logprobs: Any = Field(default=None, description="Only 0.")
    logit_bias: Any = Field(default=None, description="Only {}.")
    functions: Any = Field(default=None, description=f"Deprecated: send tools. {REFUSED}")
    function_call: Any = Field(default=None, description=f"Deprecated: tool_choice. {REFUSED}")
    service_tier: Any = Field(default=None, description='Only "auto" or "default".')
    verbosity: Any = Field(default=None, description='Only "medium".')
    moderation: Any = Field(default=None, description=REFUSED)
    prompt_cache_options: Any = Field(default=None, description=REFUSED)
    prompt_cache_retention: Any = Field(default=None, description=REFUSED)
