"""The queue contract between the services (JSON only): task names, queues and messages.

The aggregator sends a step to ``gateway.<vendor>``; the gateway answers on the queue the
request names (the aggregator's) or on a Redis list (a caller waiting in-process). A request
names its worker; it never carries a key (gateways read keys from their own environment) nor
a price (the gateway's pool file is the price table).
"""

from __future__ import annotations

from datetime import datetime
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Sampling, ToolUse
from conductor.pool import WorkerSpec
from conductor.ports import StepCallResult
from conductor.workflow import AttemptRecord

CALL_WORKER_TASK = "conductor.gateway.call_worker"
AGGREGATOR_QUEUE = "aggregator"
START_WORKFLOW_TASK = "conductor.aggregator.start_workflow"
PLAN_ROUND_TASK = "conductor.aggregator.plan_round"
STEP_RESULT_TASK = "conductor.aggregator.step_result"
CANCEL_WORKFLOW_TASK = "conductor.aggregator.cancel_workflow"
DELIVER_WEBHOOK_TASK = "conductor.aggregator.deliver_webhook"
MAX_MESSAGES = 200


def ended_channel(prefix: str) -> str:
    """The Redis channel on which the aggregator names each workflow that ended (its id, as
    text): gateways cancel that workflow's calls still in flight, so a failed step's siblings
    stop at once and the provider sees its request closed."""
    return f"{prefix}workflows:ended"


def step_key(context: StepContext) -> str:
    """One step's call, whichever of its sends: what gateways claim before calling the provider
    and record the answer under, so a step is paid for once however often it is sent."""
    return f"{context.workflow_id}:{context.step}"


def claim_key(prefix: str, key: str) -> str:
    """The Redis key a gateway holds (a short, renewed lease) while it calls for step ``key``."""
    return f"{prefix}call:claim:{key}"


def reply_key(prefix: str, key: str) -> str:
    """The Redis key holding step ``key``'s answer, written before the answer is sent."""
    return f"{prefix}call:reply:{key}"


def unapplied_key(prefix: str) -> str:
    """The sorted set of step keys whose answer was recorded (scored by when) and not yet
    committed by an aggregator: what a sweeper applies when their message was lost."""
    return f"{prefix}call:unapplied"


def queue_for(spec: WorkerSpec) -> str:
    """One queue per vendor, so each scales on its own: ``gateway.openai``, ``gateway.gemini``."""
    return f"gateway.{spec.provider.value}"


class StepContext(BaseModel):
    """Which step a call is for; the gateway hands it back untouched with the reply."""

    model_config = ConfigDict(extra="forbid")

    workflow_id: str
    step: int = Field(ge=0)
    dispatch: int = Field(ge=1)


class CallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=200)
    worker: str
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    # Exactly one of: a Redis list to push the reply onto, or a queue to send it to as a
    # STEP_RESULT_TASK.
    reply_to: str | None = Field(default=None, min_length=1, max_length=300)
    reply_queue: str | None = Field(default=None, min_length=1, max_length=200)
    context: StepContext | None = None
    # Every worker the call may reach, fallbacks included; None: any worker of the pool.
    allowed_workers: list[str] | None = Field(default=None, max_length=1000)
    # Whose call it is: calls waiting on a worker's quotas take turns between tenants.
    tenant: str | None = Field(default=None, max_length=200)
    # Functions the worker may ask the client to call (a direct call's tools); None: none.
    tools: ToolUse | None = None
    # A direct call's own max_tokens (within the worker's) and temperature; None: the worker's.
    sampling: Sampling | None = None
    # The JSON the answer must be, asked of the provider natively where it can; None: text.
    answer_format: AnswerFormat | None = None
    # A Redis stream the answer's text is appended to as the worker writes it (a workflow's
    # streamed answering step, ``answer_stream_key``); None: the answer comes whole.
    answer_stream: str | None = Field(default=None, min_length=1, max_length=300)
    # When the caller stops waiting (timezone-aware): a gateway does not start the call after
    # it and abandons the call at it, retries and quota waits included. This is what bounds
    # the longest call a gateway holds, and so the grace period a stopping gateway needs.
    # None: only the worker's own per-attempt timeout applies.
    expires_at: datetime | None = None
    # The W3C traceparent its spans belong under (its workflow's span, or a direct call's
    # request); None: not traced.
    trace_parent: str | None = Field(default=None, max_length=128)

    @model_validator(mode="after")
    def _one_reply_route(self) -> Self:
        if (self.reply_to is None) == (self.reply_queue is None):
            raise ValueError("name exactly one of reply_to (a Redis list) and reply_queue")
        if self.expires_at is not None and self.expires_at.tzinfo is None:
            raise ValueError("expires_at must carry its timezone")
        return self


class CallReply(BaseModel):
    call_id: str
    ok: bool
    result: StepCallResult | None = None
    error: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    context: StepContext | None = None


# How long a streamed answer's text stays in Redis after its last piece: its reader has it by
# then (it reads as the text comes), and a stream nobody read does not stay.
ANSWER_STREAM_TTL_S = 600


def answer_stream_key(prefix: str, workflow_id: object) -> str:
    """The Redis stream a workflow's streamed answering step writes its text to."""
    return f"{prefix}answer:{workflow_id}"
