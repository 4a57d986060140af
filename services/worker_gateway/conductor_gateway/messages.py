"""The gateway's task messages (JSON only): what a caller asks, what the gateway answers.

A request names its worker; it never carries a key (the gateway reads keys from its own
environment) nor a price (the gateway's pool file is the price table). The reply goes to a Redis
list the caller names, so a caller can wait on many replies without a thread each.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from conductor.chat import ChatMessage
from conductor.pool import WorkerSpec
from conductor.ports import StepCallResult
from conductor.workflow import AttemptRecord

CALL_WORKER_TASK = "conductor.gateway.call_worker"
MAX_MESSAGES = 200


def queue_for(spec: WorkerSpec) -> str:
    """One queue per vendor, so each scales on its own: ``gateway.openai``, ``gateway.gemini``."""
    return f"gateway.{spec.provider.value}"


class CallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=200)
    worker: str
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    reply_to: str = Field(min_length=1, max_length=300)  # a Redis list key


class CallReply(BaseModel):
    call_id: str
    ok: bool
    result: StepCallResult | None = None
    error: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
