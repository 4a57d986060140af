"""The job API: submit a workflow, read it, follow its events, score its answer."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from conductor_api.auth import CallerDep
from conductor_api.errors import ApiError, not_found, runs_elsewhere
from conductor_api.reads import MAX_SEQUENCE, load_events, load_workflow, store_feedback
from conductor_api.schemas import (
    EVENT_STREAM,
    EventView,
    Feedback,
    FeedbackStored,
    WorkflowAccepted,
    WorkflowSubmission,
    WorkflowView,
)
from conductor_api.service import WorkflowElsewhere, WorkflowService
from conductor_api.sse import KEEPALIVE, STREAM_HEADERS, event_frame, with_keepalive

router = APIRouter(prefix="/v1/workflows", tags=["Workflows"])
_SEQUENCE = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() admits "²"


@router.post("", status_code=202, response_model=WorkflowAccepted)
async def submit(body: WorkflowSubmission, request: Request, caller: CallerDep) -> WorkflowAccepted:
    """Accept a question; the workflow runs in the background. 202 with its id."""
    service: WorkflowService = request.app.state.service
    submission = service.submission(
        caller,
        body.question,
        variant=body.variant,
        pool=body.pool,
        max_steps=body.max_steps,
        cost_weight=body.cost_weight,
        metadata=body.metadata,
    )
    workflow_id = await service.submit(submission)
    request.app.state.metrics.workflows.labels(submission.variant.name).inc()
    return WorkflowAccepted(id=workflow_id, status="queued")


@router.get("/{workflow_id}", response_model=WorkflowView)
async def get_workflow(workflow_id: uuid.UUID, request: Request, caller: CallerDep) -> WorkflowView:
    """The workflow as it is now: status, plans, steps, answer, usage and cost."""
    service: WorkflowService = request.app.state.service
    view = await asyncio.to_thread(load_workflow, service.engine, workflow_id, caller.tenant)
    if view is None:
        raise not_found(f"workflow {workflow_id}")
    return view


@router.get(
    "/{workflow_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": EVENT_STREAM, "model": EventView}},
)
async def workflow_events(
    workflow_id: uuid.UUID,
    request: Request,
    caller: CallerDep,
    after: Annotated[
        int,
        Query(ge=0, le=MAX_SEQUENCE, description="Send only events with a greater sequence."),
    ] = 0,
    last_event_id: Annotated[str | None, Header(description="Standard SSE resume point.")] = None,
) -> StreamingResponse:
    """Server-sent events (``id`` = sequence, ``event`` = kind, ``data`` = the event as JSON):
    everything that already happened, then each new event; ends after the outcome."""
    service: WorkflowService = request.app.state.service
    if last_event_id is not None:
        resume = last_event_id.strip()
        if not _SEQUENCE.fullmatch(resume) or int(resume) > MAX_SEQUENCE:
            raise ApiError(
                400, "Last-Event-ID: expected an event sequence number", param="Last-Event-ID"
            )
        after = max(after, int(resume))
    found = await asyncio.to_thread(
        load_events, service.engine, workflow_id, caller.tenant, after, 0
    )
    if found is None:
        raise not_found(f"workflow {workflow_id}")
    stream = _event_stream(service, workflow_id, caller.tenant, after)
    return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)


async def _event_stream(
    service: WorkflowService, workflow_id: uuid.UUID, tenant: str, after: int
) -> AsyncIterator[str]:
    async for event in with_keepalive(service.follow(workflow_id, tenant, after)):
        if event is None:
            yield KEEPALIVE
        else:
            yield event_frame(event.sequence, event.kind, event.model_dump(mode="json"))


@router.post("/{workflow_id}/cancel", response_model=WorkflowView)
async def cancel(workflow_id: uuid.UUID, request: Request, caller: CallerDep) -> WorkflowView:
    """Cancel a queued or running workflow: its running steps are cancelled (their provider
    calls too) and it ends ``cancelled``, its events with a ``cancelled`` event. Returns the
    workflow; one that had ended already is returned as it is."""
    service: WorkflowService = request.app.state.service
    try:
        await service.cancel(workflow_id, caller.tenant, "cancelled by its client")
    except LookupError:
        raise not_found(f"workflow {workflow_id}") from None
    except WorkflowElsewhere:
        raise runs_elsewhere(workflow_id) from None
    view = await asyncio.to_thread(load_workflow, service.engine, workflow_id, caller.tenant)
    if view is None:
        raise not_found(f"workflow {workflow_id}")
    return view


@router.post("/{workflow_id}/feedback", response_model=FeedbackStored)
async def feedback(
    workflow_id: uuid.UUID,
    body: Feedback,
    request: Request,
    caller: CallerDep,
) -> FeedbackStored:
    """Score the workflow's answer (0 to 1); stored as the workflow's reward for training."""
    service: WorkflowService = request.app.state.service
    stored = await asyncio.to_thread(
        store_feedback, service.engine, workflow_id, caller.tenant, body.score
    )
    if not stored:
        raise not_found(f"workflow {workflow_id}")
    return FeedbackStored(id=workflow_id, score=body.score)
