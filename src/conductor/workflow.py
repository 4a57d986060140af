"""The typed workflow model: plans the Conductor writes and the records of running them.

A plan is data: the executor walks it; nothing here performs I/O.
Step indices in a plan are local to its round; records carry global indices across rounds.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from conductor.chat import ToolCall, Usage

ALL: Literal["all"] = "all"
AccessEntry = int | Literal["all"]


class PlanStep(BaseModel):
    """One step as the Conductor wrote it: worker id in the pool it saw, subtask, access list."""

    model_config = ConfigDict(frozen=True)

    model_id: int
    subtask: str
    access_list: tuple[AccessEntry, ...] = ()


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    steps: tuple[PlanStep, ...]

    @property
    def model_ids(self) -> list[int]:
        return [s.model_id for s in self.steps]

    @property
    def subtasks(self) -> list[str]:
        return [s.subtask for s in self.steps]

    @property
    def access_lists(self) -> list[list[AccessEntry]]:
        return [list(s.access_list) for s in self.steps]

    def as_lists_text(self) -> str:
        """The protocol's three Python lists, as the Conductor writes them."""
        return (
            f"model_id = {json.dumps(self.model_ids)}\n"
            f"subtasks = {json.dumps(self.subtasks, ensure_ascii=False)}\n"
            f"access_list = {json.dumps(self.access_lists)}"
        )


class PoolEntry(BaseModel):
    """A worker as the Conductor sees it: only "Model i" and a description, never its name."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    is_conductor: bool = False


class PlanOutcome(BaseModel):
    """The result of one Conductor call: what it wrote and the plan that will run."""

    round: int = 0
    raw_output: str
    valid: bool
    errors: list[str] = Field(default_factory=list)
    plan: Plan
    stop: bool = False
    pool: list[PoolEntry]
    usage: Usage = Usage()
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    backend: str = ""

    def worker_of(self, step: PlanStep) -> PoolEntry:
        return self.pool[step.model_id]


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        """Not ended yet: waiting for its inputs, or running."""
        return self in (StepStatus.PENDING, StepStatus.RUNNING)

    @property
    def terminal(self) -> bool:
        """Ended for good; a trace never writes an ended step again."""
        return not self.active


class StepKind(StrEnum):
    WORKER = "worker"
    CONDUCTOR = "conductor"  # a step that hands control back to the Conductor (recursion)


class AttemptRecord(BaseModel):
    """One provider call made for a step (retries and fallbacks each add one)."""

    number: int
    worker: str | None = None  # who was called: the step's worker or a fallback
    status: Literal["ok", "error"]
    error_class: str | None = None
    error: str | None = None
    status_code: int | None = None
    usage: Usage = Usage()
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    quota_wait_ms: float = 0.0  # time spent waiting for the worker's quotas before the call
    started_at: datetime


def attempts_total(attempts: list[AttemptRecord]) -> tuple[Usage, float]:
    """Tokens and cost of a step's attempts, failed ones included (a cut stream is billed)."""
    return sum((a.usage for a in attempts), Usage()), sum(a.cost_usd for a in attempts)


class StepRecord(BaseModel):
    index: int
    round: int
    kind: StepKind = StepKind.WORKER
    worker: str
    subtask: str
    access_list: list[AccessEntry]
    visible_steps: list[int] = Field(default_factory=list)
    status: StepStatus = StepStatus.PENDING
    output: str | None = None
    # The client's functions the step asked to call (the answering step of a workflow that
    # was offered tools), for the client to run; its answer then.
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Usage()
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)


class WorkflowStatus(StrEnum):
    QUEUED = "queued"  # submitted, not started yet (the distributed runtime's queue)
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # its client cancelled it, or went away while waiting for it

    @property
    def terminal(self) -> bool:
        """Ended for good, with an answer or without one."""
        return self in (WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED)


TERMINAL_WORKFLOW_STATUSES = frozenset(s for s in WorkflowStatus if s.terminal)
TERMINAL_STEP_STATUSES = frozenset(s for s in StepStatus if s.terminal)


class WorkflowRecord(BaseModel):
    """The live record of one workflow: every Conductor call, every step, and the outcome. The
    state machine changes it; observers and traces read it."""

    workflow_id: uuid.UUID
    variant: str
    question: str
    status: WorkflowStatus
    planner_calls: list[PlanOutcome]
    steps: list[StepRecord]
    answer: str | None = None
    usage: Usage = Usage()
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    error: str | None = None
    created_at: datetime
    finished_at: datetime | None = None

    @property
    def plan_valid(self) -> bool:
        return bool(self.planner_calls) and self.planner_calls[0].valid

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The client's functions a completed workflow's answer asks to call (none: a text
        answer)."""
        return answer_tool_calls(self.status.value, self.steps)


def answer_tool_calls(status: str, steps: list[StepRecord]) -> list[ToolCall]:
    """The calls that a workflow's answer asks for: its last worker step's, once completed."""
    if status != WorkflowStatus.COMPLETED.value:
        return []
    workers = [s for s in steps if s.kind is StepKind.WORKER]
    return list(workers[-1].tool_calls) if workers else []
