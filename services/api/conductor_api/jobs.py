"""The job API: submit a workflow (idempotently, with an Idempotency-Key), list a tenant's
workflows, read one, follow its events, cancel it, score its answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from conductor_adapters.webhooks import check_url, load_deliveries
from conductor_api.admission import admit, request_state
from conductor_api.auth import CallerDep
from conductor_api.errors import ApiError, not_found, runs_elsewhere
from conductor_api.reads import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    MAX_SEQUENCE,
    WorkflowFilter,
    as_utc,
    list_workflows,
    load_events,
    load_workflow,
    store_feedback,
    workflow_status,
)
from conductor_api.schemas import (
    EVENT_STREAM,
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
from conductor_api.service import IdempotencyConflict, WorkflowElsewhere, WorkflowService
from conductor_api.sse import KEEPALIVE, STREAM_HEADERS, event_frame, with_keepalive

router = APIRouter(prefix="/v1/workflows", tags=["Workflows"])
_SEQUENCE = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() admits "²"


IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no spaces


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
    service: WorkflowService = request.app.state.service
    await admit(
        service,
        request.app.state.metrics,
        caller,
        starts_workflow=True,
        state=request_state(request),
    )
    submission = service.submission(
        caller,
        body.question,
        variant=body.variant,
        pool=body.pool,
        max_steps=body.max_steps,
        cost_weight=body.cost_weight,
        metadata=body.metadata,
    )
    if body.callback_url is not None:
        check_url(body.callback_url, "callback_url")
        if not caller.signs_webhooks:
            raise ApiError(
                400,
                "callback_url: this key has no webhook signing secret, and nothing unsigned is "
                "sent: an operator makes one with `conductor keys webhook KEY_ID`",
                param="callback_url",
            )
        submission = submission.model_copy(update={"callback_url": body.callback_url})
    if idempotency_key is None:
        workflow_id = await service.submit(submission)
    else:
        if not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
            raise ApiError(
                400,
                "Idempotency-Key: 1 to 255 printable ASCII characters without spaces",
                param="Idempotency-Key",
            )
        digest = hashlib.sha256(
            json.dumps(body.model_dump(mode="json"), sort_keys=True).encode()
        ).hexdigest()
        keyed = submission.model_copy(
            update={"idempotency_key": idempotency_key, "request_hash": digest}
        )
        try:
            workflow_id, replayed = await service.submit_once(keyed)
        except IdempotencyConflict:
            raise ApiError(
                409,
                "Idempotency-Key: this key was used before with another request; use a new "
                "key for a new request",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            ) from None
        if replayed is not None:
            response.headers["Idempotent-Replayed"] = "true"
            return WorkflowAccepted(id=workflow_id, status=replayed)
    request.app.state.metrics.workflows.labels(submission.variant.name).inc()
    return WorkflowAccepted(id=workflow_id, status="queued")


@router.get("", response_model=WorkflowList)
async def list_jobs(
    request: Request,
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
    service: WorkflowService = request.app.state.service
    found = await asyncio.to_thread(
        list_workflows, service.engine, caller.tenant, wanted, limit=limit, after=after
    )
    if found is None:
        raise ApiError(400, f"after: no workflow {after} to continue from", param="after")
    page, has_more = found
    return WorkflowList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=has_more,
    )


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


@router.get("/{workflow_id}/webhooks", response_model=WebhookDeliveryList)
async def webhook_deliveries(
    workflow_id: uuid.UUID, request: Request, caller: CallerDep
) -> WebhookDeliveryList:
    """The workflow's webhook deliveries (none until it ends, or if it has no webhook): where
    each goes, whether it was delivered, and every attempt with its HTTP status or error."""
    service: WorkflowService = request.app.state.service
    engine, tenant = service.engine, caller.tenant
    if await asyncio.to_thread(workflow_status, engine, workflow_id, tenant) is None:
        raise not_found(f"workflow {workflow_id}")
    deliveries = await asyncio.to_thread(load_deliveries, engine, workflow_id, tenant)
    return WebhookDeliveryList(data=deliveries)


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
