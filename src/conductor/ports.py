"""Interfaces between the orchestration core and the services that plug into it.

The executor depends only on these, so the embedded mode (in-process objects) and the
distributed mode (gRPC planner, Celery gateway) run the same orchestration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import ConductorError
from conductor.streaming import StreamEvent
from conductor.workflow import (
    AttemptRecord,
    Plan,
    PlanOutcome,
    PoolEntry,
    StepRecord,
    WorkflowResult,
)


class PlanFormat(StrEnum):
    LISTS = "lists"  # reasoning, then the three Python lists (the paper's form)
    JSON = "json"  # one JSON object, for backends with schema-constrained decoding


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


class StepCallFailed(ConductorError):
    """Every attempt, fallbacks included, failed; ``attempts`` says how."""

    def __init__(self, message: str, attempts: list[AttemptRecord]) -> None:
        super().__init__(message)
        self.attempts = attempts


class StepRunner(Protocol):
    """Runs one step's worker call with the gateway's retries, quotas, fallbacks and costs.

    In-process in embedded mode (``WorkerGateway``), over the vendor queues in distributed mode.
    """

    @property
    def worker_names(self) -> frozenset[str]:
        """The workers this runner can call."""
        ...

    async def call(self, worker: str, messages: Sequence[ChatMessage]) -> StepCallResult: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PlannerBackend(Protocol):
    """Generates the Conductor's raw text. Backends: llamacpp, openai, transformers, vllm."""

    name: str
    plan_format: PlanFormat

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
    round: int = 0
    prior: PriorRound | None = None
    temperature: float = 0.3
    max_tokens: int = 1024
    fallback_model_id: int = 0


class Planner(Protocol):
    async def plan(self, request: PlanRequest) -> PlanOutcome: ...


class WorkflowObserver(Protocol):
    """Receives a workflow's progress; the trace store and the CLI renderer are observers."""

    async def workflow_started(
        self, result: WorkflowResult, pool_snapshot: list[dict[str, Any]]
    ) -> None: ...

    async def plan_ready(self, result: WorkflowResult, outcome: PlanOutcome) -> None: ...

    async def step_started(self, result: WorkflowResult, step: StepRecord) -> None: ...

    async def step_finished(self, result: WorkflowResult, step: StepRecord) -> None: ...

    async def workflow_finished(self, result: WorkflowResult) -> None: ...


@runtime_checkable
class EventObserver(Protocol):
    """An observer that also keeps the numbered events clients stream (the trace store)."""

    async def events_recorded(self, result: WorkflowResult, events: list[Any]) -> None: ...
