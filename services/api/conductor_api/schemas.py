"""Request and response bodies of the HTTP API (they are also its OpenAPI document).

Field limits are part of the contract: a body over them is refused with a 400 that names the
field, before any work starts. Numbers and flags are strict: `"max_steps": "5"` or `true` is a
400, not 5 or 1, since a coerced value hides the client's mistake.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from conductor.chat import ToolCall
from conductor.orchestration import MAX_QUESTION_CHARS, text_fault
from conductor.variants import MAX_STEPS_LIMIT
from conductor.workflow import AttemptRecord, PlanOutcome, StepRecord
from conductor_adapters.webhooks import DeliveryView

MAX_MESSAGES = 256
MAX_POOL_NAMES = 64
MAX_LABELS = 32
MAX_NAME_CHARS = 128  # a model, worker or label name
MAX_LABEL_VALUE_CHARS = 512


def _no_nul(value: str) -> str:
    # NUL (PostgreSQL cannot store it) or a lone surrogate: refused on every store alike, the
    # field named in the 400.
    fault = text_fault(value)
    if fault is not None:
        raise ValueError(f"must not contain {fault}")
    return value


NoNul = AfterValidator(_no_nul)
# Any other text a client sends: stored, echoed or passed on, so held to the same rule.
ClientStr = Annotated[str, NoNul]
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS), NoNul]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE_CHARS), NoNul]
# Message content, checked for NUL and lone surrogates by its message (a check inside the
# content's union would put pydantic's union member names into the error's param).
ContentText = Annotated[str, StringConstraints(max_length=MAX_QUESTION_CHARS)]
Text = Annotated[ContentText, NoNul]
CostWeight = Annotated[
    float | None,
    Field(
        ge=0,
        allow_inf_nan=False,
        description=(
            "One-step variants served by a learned router: the chance of a right answer to give "
            "up per USD per 1,000 questions saved; default: the variant's, else the router's."
        ),
    ),
]


class ConductorOptions(BaseModel):
    """Per-request orchestration options, within what the caller's API key allows."""

    model_config = ConfigDict(extra="forbid")

    pool: list[Name] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_POOL_NAMES,
        description="Workers the Conductor may use; default: every worker the key may use.",
    )
    max_steps: int | None = Field(
        default=None, ge=1, le=MAX_STEPS_LIMIT, strict=True, description="Most steps per plan."
    )
    cost_weight: CostWeight = None


class ContentPart(BaseModel):
    """A part of a message's content. Any type parses, so that a part this API cannot take (an
    image, audio, a file) is refused by name rather than as a schema mismatch."""

    model_config = ConfigDict(extra="allow")

    type: ClientStr = Field(max_length=64)
    text: ContentText | None = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: ContentText | Annotated[list[ContentPart], Field(max_length=MAX_MESSAGES)] | None = (
        None
    )
    name: Name | None = None
    # An assistant turn's calls (checked where they are read, to name the one at fault).
    tool_calls: list[Any] | None = Field(default=None, max_length=128)
    tool_call_id: ClientStr | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("content", mode="before")
    @classmethod
    def _check_content(cls, content: Any) -> Any:
        # Before the union parses it: a lone surrogate fails there, and the union's errors
        # would name its members (content.constrained-str) rather than the field.
        texts: list[Any] = [content] if isinstance(content, str) else []
        if isinstance(content, list):
            parts = [p for p in content if isinstance(p, dict)]
            texts = [p.get(name) for p in parts for name in ("type", "text")]
        _no_nul("".join(t for t in texts if isinstance(t, str)))
        return content

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class WorkflowSubmission(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Text = Field(min_length=1)
    variant: Name | None = Field(default=None, description="Default: the server's default.")
    pool: list[Name] | None = Field(default=None, min_length=1, max_length=MAX_POOL_NAMES)
    max_steps: int | None = Field(default=None, ge=1, le=MAX_STEPS_LIMIT, strict=True)
    cost_weight: CostWeight = None
    metadata: dict[Name, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    callback_url: ClientStr | None = Field(
        default=None,
        max_length=2048,
        description="Where the outcome is POSTed when the workflow ends, signed with the key's "
        "webhook secret (Standard Webhooks); default: the key's webhook URL, if any.",
    )
    stream_answer: bool = Field(
        default=False,
        strict=True,
        description="Write the answering step's text to the workflow's events as its worker "
        "writes it (answer.delta events), where the answer can stream: not in a round the "
        "Conductor reviews.",
    )


class WebhookDeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeliveryView]


class WorkflowAccepted(BaseModel):
    id: uuid.UUID
    object: Literal["workflow"] = "workflow"
    status: str


class Feedback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    score: float = Field(
        ge=0.0, le=1.0, strict=True, description="0 (wrong) to 1 (right); kept as reward."
    )


class FeedbackStored(BaseModel):
    id: uuid.UUID
    object: Literal["workflow.feedback"] = "workflow.feedback"
    score: float


class UsageView(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class StepView(StepRecord):
    attempts: list[AttemptRecord] = Field(default_factory=list)


WorkflowStatusName = Literal["queued", "running", "completed", "failed", "cancelled"]


class WorkflowView(BaseModel):
    """A workflow as a client sees it: running or finished."""

    id: uuid.UUID
    object: Literal["workflow"] = "workflow"
    status: WorkflowStatusName
    variant: str
    question: str
    metadata: dict[str, str]
    plan_valid: bool
    planner_calls: list[PlanOutcome]
    steps: list[StepView]
    answer: str | None
    # The client's functions the answer asks to call (a workflow offered tools): the
    # client runs them and sends their results in its next request. Empty: a text answer.
    tool_calls: list[ToolCall] = Field(default_factory=list)
    error: str | None
    usage: UsageView
    cost_usd: float
    latency_ms: float
    feedback: float | None
    created_at: datetime
    finished_at: datetime | None


class WorkflowSummary(BaseModel):
    """A workflow in a list: its outcome and cost, without its plans and steps."""

    id: uuid.UUID
    object: Literal["workflow"] = "workflow"
    status: WorkflowStatusName
    variant: str
    question: str = Field(description="The question's first 500 characters.")
    metadata: dict[str, str]
    error: str | None
    usage: UsageView
    cost_usd: float
    latency_ms: float
    step_count: int = Field(description="The worker and Conductor steps planned, all rounds.")
    created_at: datetime
    finished_at: datetime | None


class WorkflowList(BaseModel):
    """A page of workflows, newest first; pass ``last_id`` as ``after`` for the next."""

    object: Literal["list"] = "list"
    data: list[WorkflowSummary]
    first_id: uuid.UUID | None
    last_id: uuid.UUID | None
    has_more: bool


class EventView(BaseModel):
    """One event of a workflow; ``data`` is the plan, the step, or the finished workflow."""

    workflow_id: uuid.UUID
    sequence: int
    kind: Literal["plan", "step_started", "step_finished", "completed", "failed", "cancelled"]
    at: datetime
    data: dict[str, Any]


class AnswerDeltaView(BaseModel):
    """A piece of the answer's text as its worker writes it (an ``answer.delta`` event of a
    workflow submitted with ``stream_answer``); not stored, so it has no sequence."""

    workflow_id: uuid.UUID
    text: str
    offset: int = Field(description="Characters of the answer before this piece.")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    kind: Literal["variant", "worker"]
    description: str = ""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error, as the OpenAI API writes it."""

    error: ErrorDetail


# -- what chat completions answer (documented in the OpenAPI document; the route writes the
# same JSON directly, without a second walk through these models) --------------------------


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="JSON text, as the model wrote it.")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="Null when the worker answered with tool calls.")
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class CompletionChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class ChatCompletion(BaseModel):
    """A ``chat.completion``; ``conductor`` holds the workflow (id, variant, status, steps,
    cost) or, for a worker called directly, the worker that answered and its cost."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    conductor: dict[str, Any]


# Server-sent events, as the OpenAPI document describes a stream's body.
EVENT_STREAM = {"text/event-stream": {"schema": {"type": "string", "format": "event-stream"}}}
