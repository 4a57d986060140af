"""The job API: submit a workflow (idempotently, with an Idempotency-Key), list a tenant's
workflows, read one, follow its events, cancel it, score its answer."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from conductor_adapters.webhooks import load_deliveries
from conductor_api.admission import keep_limit_headers
from conductor_api.answers import AnswerText, follow_with_answer
from conductor_api.auth import CallerDep, ServiceDep
from conductor_api.errors import ApiError, not_found, runs_elsewhere
from conductor_api.reads import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    MAX_SEQUENCE,
    WorkflowFilter,
    as_utc,
    store_feedback,
)
from conductor_api.runtime import WorkflowElsewhere
from conductor_api.schemas import (
    EVENT_STREAM,
    AnswerDeltaView,
    ErrorResponse,
    EventView,
    Feedback,
    FeedbackStored,
    WebhookDeliveryList,
    WorkflowAccepted,
    WorkflowList,
    WorkflowStatusName,
    WorkflowSubmission,
    WorkflowView,
)
from conductor_api.service import WorkflowService
from conductor_api.sse import KEEPALIVE, STREAM_HEADERS, event_frame, named_frame

router = APIRouter(prefix="/v1/workflows", tags=["Workflows"])
_SEQUENCE = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() admits "²"
ANSWER_DELTA = "answer.delta"  # the SSE event of a piece of the answer's text


@router.post(
    "",
    status_code=202,
    response_model=WorkflowAccepted,
    responses={
        409: {
            "model": ErrorResponse,
            "description": "The Idempotency-Key came with another request before",
        }
    },
)
async def submit(
    body: WorkflowSubmission,
    request: Request,
    response: Response,
    service: ServiceDep,
    caller: CallerDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="Sent again with the same body, gives back the workflow the first "
            "request made instead of a new one; with another body, 409."
        ),
    ] = None,
) -> WorkflowAccepted:
    """Accept a question; the workflow runs in the background. 202 with its id."""
    started = await service.start_workflow(
        caller,
        body.question,
        variant=body.variant,
        pool=body.pool,
        max_steps=body.max_steps,
        cost_weight=body.cost_weight,
        metadata=body.metadata,
        callback_url=body.callback_url,
        idempotency_key=idempotency_key,
        stream_answer=body.stream_answer,
    )
    keep_limit_headers(request, started.limit_headers)
    if started.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return WorkflowAccepted(id=started.workflow_id, status=started.status)


@router.get("", response_model=WorkflowList)
async def list_jobs(
    service: ServiceDep,
    caller: CallerDep,
    status: Annotated[WorkflowStatusName | None, Query(description="Only this status.")] = None,
    variant: Annotated[str | None, Query(max_length=128, description="Only this variant.")] = None,
    label: Annotated[
        list[str] | None,
        Query(description="NAME:VALUE; repeat for several, all must match."),
    ] = None,
    created_after: Annotated[
        datetime | None, Query(description="Created at or after (ISO 8601 or Unix seconds).")
    ] = None,
    created_before: Annotated[datetime | None, Query(description="Created before.")] = None,
    q: Annotated[
        str | None,
        Query(max_length=200, description="Words the question holds, all of them, any case."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
    after: Annotated[
        uuid.UUID | None, Query(description="The last_id of the previous page.")
    ] = None,
) -> WorkflowList:
    """The key's tenant's workflows, newest first, a page at a time."""
    # q, variant and label hold no NUL or lone surrogate: app.QueryText refused them.
    labels = {}
    for item in label or []:
        name, sep, value = item.partition(":")
        if not sep or not name:
            raise ApiError(400, f"label: expected NAME:VALUE, not {item!r}", param="label")
        labels[name] = value
    wanted = WorkflowFilter(
        status=status,
        variant=variant,
        labels=labels,
        created_after=as_utc(created_after),
        created_before=as_utc(created_before),
        search=q,
    )
    page, has_more = await service.list_page(caller.tenant, wanted, limit=limit, after=after)
    return WorkflowList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=has_more,
    )


@router.get("/{workflow_id}", response_model=WorkflowView)
async def get_workflow(
    workflow_id: uuid.UUID, service: ServiceDep, caller: CallerDep
) -> WorkflowView:
    """The workflow as it is now: status, plans, steps, answer, usage and cost."""
    view = await service.read(workflow_id, caller.tenant)
    if view is None:
        raise not_found(f"workflow {workflow_id}")
    return view


@router.get(
    "/{workflow_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": EVENT_STREAM,
            "model": EventView,
            "description": "The stored events; answer.delta events (AnswerDeltaView, without "
            "an id) between them where the workflow was submitted with stream_answer.",
        }
    },
)
async def workflow_events(
    workflow_id: uuid.UUID,
    service: ServiceDep,
    caller: CallerDep,
    after: Annotated[
        int,
        Query(ge=0, le=MAX_SEQUENCE, description="Send only events with a greater sequence."),
    ] = 0,
    last_event_id: Annotated[str | None, Header(description="Standard SSE resume point.")] = None,
) -> StreamingResponse:
    """Server-sent events (``id`` = sequence, ``event`` = kind, ``data`` = the event as JSON):
    everything that already happened, then each new event; ends after the outcome. A workflow
    submitted with ``stream_answer`` has, while it runs, its answer's text in between as it is
    written: ``event: answer.delta`` without an ``id`` (not stored: Last-Event-ID stays the
    last stored sequence), ``data`` = ``{"workflow_id", "text", "offset"}`` with ``offset``
    the characters of the answer before the piece; all of it before the outcome. Every
    stream, a resume too, sends the pieces from the answer's start: ``offset`` tells what a
    client has."""
    if last_event_id is not None:
        resume = last_event_id.strip()
        if not _SEQUENCE.fullmatch(resume) or int(resume) > MAX_SEQUENCE:
            raise ApiError(
                400, "Last-Event-ID: expected an event sequence number", param="Last-Event-ID"
            )
        after = max(after, int(resume))
    if not await service.exists(workflow_id, caller.tenant):
        raise not_found(f"workflow {workflow_id}")
    stream = _event_stream(service, workflow_id, caller.tenant, after)
    return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)


async def _event_stream(
    service: WorkflowService, workflow_id: uuid.UUID, tenant: str, after: int
) -> AsyncIterator[str]:
    followed = follow_with_answer(service, workflow_id, tenant, after, keepalive=True)
    async with contextlib.aclosing(followed) as items:
        async for item in items:
            if item is None:
                yield KEEPALIVE
            elif isinstance(item, AnswerText):
                delta = AnswerDeltaView(workflow_id=workflow_id, text=item.text, offset=item.offset)
                yield named_frame(ANSWER_DELTA, delta.model_dump(mode="json"))
            else:
                yield event_frame(item.sequence, item.kind, item.model_dump(mode="json"))


@router.get("/{workflow_id}/webhooks", response_model=WebhookDeliveryList)
async def webhook_deliveries(
    workflow_id: uuid.UUID, service: ServiceDep, caller: CallerDep
) -> WebhookDeliveryList:
    """The workflow's webhook deliveries (none until it ends, or if it has no webhook): where
    each goes, whether it was delivered, and every attempt with its HTTP status or error."""
    if not await service.exists(workflow_id, caller.tenant):
        raise not_found(f"workflow {workflow_id}")
    deliveries = await asyncio.to_thread(
        load_deliveries, service.engine, workflow_id, caller.tenant
    )
    return WebhookDeliveryList(data=deliveries)


@router.post("/{workflow_id}/cancel", response_model=WorkflowView)
async def cancel(workflow_id: uuid.UUID, service: ServiceDep, caller: CallerDep) -> WorkflowView:
    """Cancel a queued or running workflow: its running steps are cancelled (their provider
    calls too) and it ends ``cancelled``, its events with a ``cancelled`` event. Returns the
    workflow; one that had ended already is returned as it is."""
    try:
        await service.cancel(workflow_id, caller.tenant, "cancelled by its client")
    except LookupError:
        raise not_found(f"workflow {workflow_id}") from None
    except WorkflowElsewhere:
        raise runs_elsewhere(workflow_id) from None
    view = await service.read(workflow_id, caller.tenant)
    if view is None:
        raise not_found(f"workflow {workflow_id}")
    return view


@router.post("/{workflow_id}/feedback", response_model=FeedbackStored)
async def feedback(
    workflow_id: uuid.UUID,
    body: Feedback,
    service: ServiceDep,
    caller: CallerDep,
) -> FeedbackStored:
    """Score the workflow's answer (0 to 1); stored as the workflow's reward for training."""
    stored = await asyncio.to_thread(
        store_feedback, service.engine, workflow_id, caller.tenant, body.score
    )
    if not stored:
        raise not_found(f"workflow {workflow_id}")
    return FeedbackStored(id=workflow_id, score=body.score)
