"""Request and response bodies of ``/v1/responses`` and ``/v1/completions``.

The Responses request names every field of the OpenAI API: those Conductor honours, those the
SDKs send by default with values that ask for nothing (``tools: []``, ``tool_choice: "auto"``,
``truncation: "disabled"``, ``include: []``, ...), and those it cannot honour, which are refused
by the route with a 400 naming them unless they carry such a neutral value. A field the API
does not know is refused too, as the OpenAI API does: nothing a client asks for is dropped
without a word.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from conductor.orchestration import MAX_QUESTION_CHARS
from conductor_api.chat_request import StreamOptions
from conductor_api.schemas import (
    MAX_LABELS,
    MAX_MESSAGES,
    ClientStr,
    CompletionUsage,
    ConductorOptions,
    LabelValue,
    Name,
    Text,
)

MAX_RESPONSE_ID_CHARS = 64

_PART_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["input_text", "output_text"]},
        "text": {"type": "string"},
    },
    "required": ["type", "text"],
}
INPUT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "maxItems": MAX_MESSAGES,
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["message"]},
                    "role": {
                        "type": "string",
                        "enum": ["user", "system", "developer", "assistant"],
                    },
                    "content": {
                        "anyOf": [
                            {"type": "string"},
                            {"type": "array", "items": _PART_SCHEMA},
                        ]
                    },
                },
                "required": ["role", "content"],
            },
        },
    ]
}
_PROMPT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
    ]
}
# Cut to a label's length when kept; past the question's length, refused.
ClientMetadataValue = Annotated[ClientStr, Field(max_length=MAX_QUESTION_CHARS)]
_REFUSED = "Refused (400) unless null or its neutral value: Conductor cannot honour it."


class ResponseStreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_obfuscation: bool | None = Field(
        default=None, description="Accepted; events are never padded."
    )
    # Codex sends it to OpenAI's own endpoint; a workflow's progress summary streams as it
    # comes whatever it says.
    reasoning_summary_delivery: ClientStr | None = Field(
        default=None,
        max_length=64,
        description="Accepted, no effect: a workflow's reasoning summary streams as it comes.",
    )


class ResponseCreateRequest(BaseModel):
    """The OpenAI ``responses.create`` request, answered by a workflow (model = a variant) or
    one worker (model = its name). An unknown field is refused."""

    model_config = ConfigDict(extra="forbid")

    model: Name = Field(description="A variant (e.g. conductor-ultra) or a worker's name.")
    # Checked by the route, which names the item and part at fault (input.2.content.0).
    input: Annotated[Any, WithJsonSchema(INPUT_SCHEMA)] = Field(
        description=(
            "A string (one user message), or input items: messages with role user, system, "
            f"developer or assistant (at most {MAX_MESSAGES}), content a string or input_text / "
            "output_text parts."
        )
    )
    instructions: Text | None = Field(
        default=None, description="A system message before the input (not carried over)."
    )
    previous_response_id: ClientStr | None = Field(
        default=None,
        max_length=MAX_RESPONSE_ID_CHARS,
        description="A stored response to continue: its input and output come first.",
    )
    store: bool | None = Field(
        default=None, strict=True, description="Default true: keep it, to read and continue."
    )
    stream: bool | None = Field(default=None, strict=True)
    stream_options: ResponseStreamOptions | None = None
    max_output_tokens: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        description="Bounds a worker called directly (within the pool file's bound); a "
        "workflow's steps keep the pool file's.",
    )
    metadata: dict[Name, LabelValue] | None = Field(
        default=None, max_length=MAX_LABELS, description="Labels, kept with the workflow."
    )
    client_metadata: dict[Name, ClientMetadataValue] | None = Field(
        default=None,
        max_length=MAX_LABELS,
        description="Kept with metadata as labels (metadata wins a name both hold), each value "
        "cut to a label's 512 characters; Codex CLI sends its session's ids here.",
    )
    conductor: ConductorOptions | None = None
    # A worker called directly takes it instead of its own (as in chat completions).
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    # Sent by the SDKs; accepted, echoed, no effect on the answer.
    top_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    user: ClientStr | None = Field(default=None, max_length=512)
    safety_identifier: ClientStr | None = Field(default=None, max_length=512)
    prompt_cache_key: ClientStr | None = Field(default=None, max_length=512)
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    max_tool_calls: int | None = Field(default=None, ge=0, strict=True)
    # Accepted with their neutral values only.
    tools: list[Any] | None = Field(
        default=None,
        max_length=128,
        description="Function tools, passed to a worker called directly whose wire format "
        'takes them; a workflow takes them only with tool_choice "none".',
    )
    tool_choice: Any = Field(default=None, description='"auto", "none", "required" or a function.')
    truncation: Any = Field(default=None, description='Only "disabled".')
    include: list[Any] | None = Field(
        default=None,
        description='[] or ["reasoning.encrypted_content"] (accepted; a reasoning item holds '
        "no encrypted content).",
    )
    text: Any = Field(
        default=None,
        description="format: text, json_object or json_schema (structured output); verbosity: "
        'only "medium".',
    )
    reasoning: Any = Field(
        default=None,
        description="effort and summary: accepted, no effect (each worker runs with the pool "
        "file's settings; a workflow's progress is summarised in a reasoning item whatever "
        "they say).",
    )
    background: Any = Field(default=None, description="Only false.")
    service_tier: Any = Field(default=None, description='Only "auto" or "default".')
    top_logprobs: Any = Field(default=None, description="Only 0.")
    conversation: Any = Field(default=None, description=_REFUSED)
    prompt: Any = Field(default=None, description=_REFUSED)
    context_management: Any = Field(default=None, description=_REFUSED)
    moderation: Any = Field(default=None, description=_REFUSED)
    prompt_cache_options: Any = Field(default=None, description=_REFUSED)
    prompt_cache_retention: Any = Field(default=None, description=_REFUSED)


# -- what the routes answer (documented in the OpenAPI document; the routes write the same
# JSON directly) ---------------------------------------------------------------------------


class ResponseOutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ResponseOutputMessageItem(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ResponseOutputTextPart]


class ResponseFunctionCallItem(BaseModel):
    """A function a worker called directly asks the client to run."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = Field(description="JSON text, as the model wrote it.")
    status: Literal["in_progress", "completed"]


class ResponseSummaryText(BaseModel):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ResponseReasoningItem(BaseModel):
    """A workflow's progress: a summary part per plan and per step that ended (not the
    answer's), never what a step wrote. First in a workflow's output; sent back as input, it
    is ignored."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[ResponseSummaryText]
    encrypted_content: None = None
    status: Literal["in_progress", "completed"]


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class InputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseErrorDetail(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    """A ``response``; ``conductor`` holds the workflow (id, variant, status, steps, cost) or,
    for a worker called directly, the worker that answered and its cost."""

    id: str = Field(description="resp_ and the workflow's id (hex) for a workflow's response.")
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["queued", "in_progress", "completed", "failed", "cancelled", "incomplete"]
    model: str
    output: list[ResponseReasoningItem | ResponseOutputMessageItem | ResponseFunctionCallItem]
    usage: ResponseUsage | None
    error: ResponseErrorDetail | None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    previous_response_id: str | None
    metadata: dict[str, str]
    store: bool
    max_output_tokens: int | None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    temperature: float | None
    top_p: float | None
    parallel_tool_calls: bool
    tool_choice: str
    tools: list[Any]
    truncation: str
    text: dict[str, Any]
    reasoning: dict[str, Any]
    background: bool
    user: str | None = None
    conductor: dict[str, Any]


class InputTextPart(BaseModel):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = Field(default=None, description="[] on an output_text part.")


class ResponseInputItem(BaseModel):
    """An input message as stored: parts input_text, or output_text for the assistant's."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    status: Literal["completed"] = "completed"
    content: list[InputTextPart]


class ResponseInputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ResponseInputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


# -- /v1/completions ------------------------------------------------------------------------


class CompletionRequest(BaseModel):
    """The legacy OpenAI completion request, answered as a chat completion of one user message
    (the prompt). ``max_tokens`` and ``temperature`` work as in chat completions; other
    sampling fields (stop, top_p, ...) are accepted and have no effect; an unknown field is
    refused."""

    model_config = ConfigDict(extra="forbid")

    model: Name = Field(description="A variant (e.g. conductor-ultra) or a worker's name.")
    # Checked by the route (a union's errors would name its members in the param).
    prompt: Annotated[Any, WithJsonSchema(_PROMPT_SCHEMA)] = Field(
        description="One prompt: a string, or a list of exactly one string."
    )
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1, strict=True, description="Only one choice.")
    best_of: int | None = Field(default=None, ge=1, le=1, strict=True, description="Only 1.")
    echo: bool = Field(default=False, strict=True, description="Only false.")
    suffix: str | None = Field(default=None, description="Only null.")
    logprobs: int | None = Field(default=None, description="Only null.")
    conductor: ConductorOptions | None = None
    metadata: dict[Name, LabelValue] | None = Field(default=None, max_length=MAX_LABELS)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    # Accepted, no effect on the answer.
    top_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    stop: Any = Field(default=None, description="A string or a list of them; no effect.")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    seed: int | None = Field(default=None, strict=True)
    user: ClientStr | None = Field(default=None, max_length=512)
    logit_bias: Any = Field(default=None, description="Only {}.")


class CompletionChoiceText(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: None = None


class TextCompletion(BaseModel):
    """A ``text_completion``; ``conductor`` as in a chat completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoiceText]
    usage: CompletionUsage | None = None
    conductor: dict[str, Any] | None = None
