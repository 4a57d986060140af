"""Workflows and events as ``conductor.v1`` messages, for the gRPC Workflows service."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from conductor.workflow import AttemptRecord, PlanOutcome, StepKind, StepRecord, StepStatus
from conductor_adapters.rpc.planner_wire import access_to_proto, outcome_to_proto, usage_to_proto
from conductor_adapters.rpc.v1 import common_pb2, workflows_pb2
from conductor_api.schemas import EventView, StepView, WorkflowSummary, WorkflowView

WORKFLOW_STATUS = {
    "queued": common_pb2.WORKFLOW_STATUS_QUEUED,
    "running": common_pb2.WORKFLOW_STATUS_RUNNING,
    "completed": common_pb2.WORKFLOW_STATUS_COMPLETED,
    "failed": common_pb2.WORKFLOW_STATUS_FAILED,
    "cancelled": common_pb2.WORKFLOW_STATUS_CANCELLED,
}
STEP_STATUS = {
    StepStatus.PENDING: common_pb2.STEP_STATUS_PENDING,
    StepStatus.RUNNING: common_pb2.STEP_STATUS_RUNNING,
    StepStatus.SUCCEEDED: common_pb2.STEP_STATUS_SUCCEEDED,
    StepStatus.FAILED: common_pb2.STEP_STATUS_FAILED,
    StepStatus.CANCELLED: common_pb2.STEP_STATUS_CANCELLED,
}
STEP_KIND = {
    StepKind.WORKER: common_pb2.STEP_KIND_WORKER,
    StepKind.CONDUCTOR: common_pb2.STEP_KIND_CONDUCTOR,
}


def timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def _optional(**fields: Any) -> dict[str, Any]:
    """Proto3 optional and message fields: set only the ones that have a value."""
    return {name: value for name, value in fields.items() if value is not None}


def attempt_to_proto(attempt: AttemptRecord) -> Any:
    return common_pb2.Attempt(
        number=attempt.number,
        status=common_pb2.ATTEMPT_STATUS_OK
        if attempt.status == "ok"
        else common_pb2.ATTEMPT_STATUS_ERROR,
        usage=usage_to_proto(attempt.usage),
        cost_usd=attempt.cost_usd,
        latency_ms=attempt.latency_ms,
        started_at=timestamp(attempt.started_at),
        **_optional(
            error_class=attempt.error_class,
            error=attempt.error,
            status_code=attempt.status_code,
        ),
    )


def step_to_proto(step: StepRecord) -> Any:
    return common_pb2.Step(
        index=step.index,
        round=step.round,
        kind=STEP_KIND[step.kind],
        worker=step.worker,
        subtask=step.subtask,
        access_list=[access_to_proto(entry) for entry in step.access_list],
        visible_steps=step.visible_steps,
        status=STEP_STATUS[step.status],
        usage=usage_to_proto(step.usage),
        cost_usd=step.cost_usd,
        latency_ms=step.latency_ms,
        attempts=[attempt_to_proto(a) for a in step.attempts],
        **_optional(
            output=step.output,
            error=step.error,
            started_at=timestamp(step.started_at) if step.started_at else None,
            finished_at=timestamp(step.finished_at) if step.finished_at else None,
        ),
    )


def workflow_to_proto(view: WorkflowView) -> Any:
    return common_pb2.Workflow(
        id=str(view.id),
        variant=view.variant,
        question=view.question,
        status=WORKFLOW_STATUS[view.status],
        planner_calls=[outcome_to_proto(call) for call in view.planner_calls],
        steps=[step_to_proto(step) for step in view.steps],
        usage=common_pb2.Usage(**view.usage.model_dump()),
        cost_usd=view.cost_usd,
        latency_ms=view.latency_ms,
        created_at=timestamp(view.created_at),
        plan_valid=view.plan_valid,
        metadata=view.metadata,
        **_optional(
            answer=view.answer,
            error=view.error,
            finished_at=timestamp(view.finished_at) if view.finished_at else None,
        ),
    )


def summary_to_proto(summary: WorkflowSummary) -> Any:
    return workflows_pb2.WorkflowSummary(
        id=str(summary.id),
        status=WORKFLOW_STATUS[summary.status],
        variant=summary.variant,
        question=summary.question,
        metadata=summary.metadata,
        usage=common_pb2.Usage(**summary.usage.model_dump()),
        cost_usd=summary.cost_usd,
        latency_ms=summary.latency_ms,
        created_at=timestamp(summary.created_at),
        **_optional(
            error=summary.error,
            finished_at=timestamp(summary.finished_at) if summary.finished_at else None,
        ),
    )


def event_to_proto(event: EventView, outcome: WorkflowView | None = None) -> Any:
    """``outcome``: the finished workflow, for the completed, failed and cancelled events."""
    payload: dict[str, Any]
    if event.kind == "plan":
        payload = {"plan": outcome_to_proto(PlanOutcome.model_validate(event.data))}
    elif event.kind in ("step_started", "step_finished"):
        payload = {event.kind: step_to_proto(StepView.model_validate(event.data))}
    else:
        assert outcome is not None, "the outcome events carry the finished workflow"
        payload = {event.kind: workflow_to_proto(outcome)}
    return workflows_pb2.WorkflowEvent(
        workflow_id=str(event.workflow_id),
        sequence=event.sequence,
        at=timestamp(event.at),
        **payload,
    )


def answer_delta_to_proto(workflow_id: uuid.UUID, sequence: int, text: str, offset: int) -> Any:
    """A piece of the answer's text, ``offset`` characters into it, as an event: ``sequence``
    is the last stored event's sent before it, ``at`` when it is sent."""
    return workflows_pb2.WorkflowEvent(
        workflow_id=str(workflow_id),
        sequence=sequence,
        at=timestamp(datetime.now(UTC)),
        answer_delta=workflows_pb2.AnswerDelta(text=text, offset=offset),
    )
