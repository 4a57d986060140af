"""Interfaces between the orchestration core and the services that plug into it.

The executor depends only on these, so the embedded mode (in-process objects) and the
distributed mode (gRPC planner, Celery gateway) run the same orchestration.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Completion, Sampling, ToolCall, ToolUse, Usage
from conductor.streaming import StreamEvent
from conductor.workflow import AttemptRecord, Plan, PlanOutcome, PoolEntry, WorkflowRecord

if TYPE_CHECKING:  # the machine imports this module's request types
    from conductor.machine import MachineEvent


class PlanFormat(StrEnum):
    LISTS = "lists"  # reasoning, then the three Python lists (the paper's form)
    JSON = "json"  # one JSON object, for backends with schema-constrained decoding


class PromptForm(StrEnum):
    """What the Conductor's prompt carries besides the pool and the question. A model is served
    the form it was trained on: one trained without the examples plans worse with them, and
    every prompt token costs time."""

    FULL = "full"  # the rules and the few-shot examples: for models not trained on our prompt
    SHORT = "short"  # the rules without the examples (checkpoints trained before COMPACT)
    COMPACT = "compact"  # the rules in brief, no examples: what training without examples writes
    # The output format alone, the pool by worker names, a long question's head and tail; the
    # plan comes without reasoning. For checkpoints trained on it: the fewest tokens a plan costs.
    MINIMAL = "minimal"

    @property
    def examples(self) -> bool:
        return self is PromptForm.FULL

    @property
    def reasoning(self) -> bool:
        """Whether a plan starts with a line of reasoning (every form but MINIMAL)."""
        return self is not PromptForm.MINIMAL


@runtime_checkable
class ChatWorker(Protocol):
    """A worker LLM reachable for chat completions: one provider call per method call.

    ``stream`` yields TextDelta events closed by one StreamEnd (usage, finish reason); a stream
    that stops without its StreamEnd was cut. Retries and quotas belong to the gateway.
    """

    name: str

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion: ...

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ToolCallingWorker(Protocol):
    """A worker whose wire format carries function calling: offered tools, it may answer with
    calls for the client to run (``Completion.tool_calls``) instead of text."""

    async def complete_with_tools(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolUse,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion: ...


@runtime_checkable
class FormattedAnswerWorker(Protocol):
    """A worker whose provider constrains an answer to JSON natively (OpenAI's
    ``response_format``, Anthropic's and Gemini's structured outputs): the schema reaches the
    provider in its own form, not only the prompt. The caller still validates the answer."""

    async def complete_in_format(
        self,
        messages: Sequence[ChatMessage],
        answer_format: AnswerFormat,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion: ...


class StepCallResult(BaseModel):
    """A step's worker call as the gateway ran it: the answer and every attempt it took.

    ``worker`` is who answered: the step's worker, or one of its fallbacks. Usage and cost add
    up every attempt, failed ones included (a cut stream may have been billed).
    """

    text: str
    worker: str
    finish_reason: str | None = None
    usage: Usage = Usage()
    cost_usd: float = 0.0
    attempts: list[AttemptRecord]
    tool_calls: list[ToolCall] = Field(default_factory=list)  # asked for instead of text


# Where an answer's text goes as its worker writes it, a piece at a time (awaited: a sink
# that writes to another process keeps the pieces in order).
DeltaSink = Callable[[str], Awaitable[None]]


class AnswerStreams(Protocol):
    """Where the embedded driver sends the text of a workflow's streamed answering step as it
    arrives (the API hands it to the client that waits for the answer)."""

    def sink(self, workflow_id: uuid.UUID, step: int) -> DeltaSink: ...


class StepRunner(Protocol):
    """Runs one step's worker call with the gateway's retries, quotas, fallbacks and costs.

    In-process in embedded mode (``WorkerGateway``), over the vendor queues in distributed mode.
    """

    @property
    def worker_names(self) -> frozenset[str]:
        """The workers this runner can call."""
        ...

    async def call(
        self,
        worker: str,
        messages: Sequence[ChatMessage],
        *,
        allowed_workers: Collection[str] | None = None,
        tenant: str | None = None,
        tools: ToolUse | None = None,
        sampling: Sampling | None = None,
        attempts: list[AttemptRecord] | None = None,
        answer_format: AnswerFormat | None = None,
        deltas: DeltaSink | None = None,
    ) -> StepCallResult:
        """``allowed_workers``: every worker the call may reach, fallbacks included (a
        workflow's pool, an API key's pool); None: any worker of the pool. ``tenant``: whose
        call it is, for its fair turn among calls waiting on a worker's quotas. ``tools``:
        functions the worker may ask to call (only workers whose wire format has them).
        ``sampling``: a direct call's own max_tokens and temperature (None: the worker's).
        ``answer_format``: the JSON the answer must be, asked of the provider natively where
        its wire format can (``FormattedAnswerWorker``); the caller validates the answer.
        ``deltas``: receives the answer's text as the worker writes it (the call streams,
        whatever the pool file says); once any text has gone to it, a failed attempt is not
        retried, since its receiver has shown that text.
        ``attempts``: where each provider call is appended as it is made, so that a caller who
        cancels the call still knows the calls that may be billed (a runner whose calls are
        recorded elsewhere may leave it empty)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PlannerBackend(Protocol):
    """Generates the Conductor's raw text. Backends: llamacpp, openai, transformers, vllm."""

    name: str
    plan_format: PlanFormat
    # The prompt form its model was trained on (FULL for a model no Conductor training wrote).
    prompt_form: PromptForm

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion: ...

    async def aclose(self) -> None: ...


class PriorRound(BaseModel):
    """What a re-planning Conductor sees: its previous plan, each step's answer, the last one."""

    model_config = ConfigDict(frozen=True)

    plan: Plan
    answers: list[str | None]
    last_answer: str


class PlanRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    question: str
    pool: list[PoolEntry]
    max_steps: int
    # Most steps any plan of the workflow may have: the prompt's instructions and examples are
    # written for it, so every round shares one system prompt (and the model's cache of it); a
    # round allowed fewer (``max_steps``) says so in its user message. None: ``max_steps``.
    workflow_max_steps: int | None = None
    round: int = 0
    prior: PriorRound | None = None
    temperature: float = 0.3
    max_tokens: int = 1024
    fallback_model_id: int = 0
    # A learned router's cost weight for this request (one-step variants); None: its own.
    cost_weight: float | None = Field(default=None, ge=0)


class Planner(Protocol):
    async def plan(self, request: PlanRequest) -> PlanOutcome: ...


class WorkflowObserver(Protocol):
    """Receives what a workflow's state machine recorded, in order: the trace store, the CLI's
    live view and the API's event announcements are observers. Each delivery is a batch of
    events and the record they happened to (read an event's subject with
    ``conductor.machine.event_subject``); an observer may act on some kinds and ignore the rest.
    """

    async def observe(self, workflow: WorkflowRecord, events: Sequence[MachineEvent]) -> None: ...
