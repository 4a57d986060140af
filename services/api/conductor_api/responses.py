"""``/v1/responses``: the OpenAI Responses API, on top of the same workflows as chat completions.

The model is a variant (a workflow the Conductor writes) or one worker's name (a plain
pass-through call), exactly as in chat completions. A workflow's response has the workflow's
id (``resp_<hex>``), a reasoning item that summarises its progress (its plans and how its steps
ended, streamed as they happen), its answer as the output message, the workflow's usage, and
the extra ``conductor`` field with the workflow and its steps. The input (a string or message
items), the ``instructions`` and, with ``previous_response_id``, the earlier response's input and
output become the question the Conductor gets, rendered as chat completions render a
conversation.

A response is stored unless ``store`` is false: it can then be read back, its input items
listed, continued, and deleted (its workflow's trace stays). Whatever Conductor cannot honour
(files, hosted tools, background runs) is refused with a 400
naming the field, never dropped (``responses_request``, ``request_policy``); the fields the
SDKs and Codex CLI send that do not change the answer are accepted. The response object is
built in ``responses_objects``, the streamed events in ``responses_events``, stored responses
are read in ``responses_store``, and ``responses_tokens`` counts an input's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conductor.answer_format import AnswerFormat
from conductor.chat import ToolUse
from conductor.ports import StepCallResult
from conductor_adapters.store.responses import (
    StoredResponse,
    delete_response,
    insert_response,
)
from conductor_api import completions, responses_tokens
from conductor_api.admission import keep_limit_headers
from conductor_api.answers import (
    AnswerText,
    completed_workflow,
    disconnected,
    progress_comment,
    with_answer_text,
    workflow_events,
)
from conductor_api.auth import CallerDep, ServiceDep
from conductor_api.direct_calls import DirectCall
from conductor_api.errors import ApiError, invalid, not_found, unknown_model, unsupported
from conductor_api.images import check_images
from conductor_api.openai_shared import (
    check_passthrough,
    check_tools,
    finish_reason,
    passthrough_field,
    sampling_of,
    worker_messages,
    workflow_answer_format,
    workflow_failed,
)
from conductor_api.progress_summary import ProgressFacts
from conductor_api.responses_events import ResponseEvents
from conductor_api.responses_objects import (
    passthrough_object,
    response_object,
    responses_usage,
    workflow_object,
)
from conductor_api.responses_request import (
    check_supported,
    conversation,
    first_image,
    input_items,
    labels_of,
    question,
    text_answer_format,
)
from conductor_api.responses_schemas import (
    ResponseCreateRequest,
    ResponseDeleted,
    ResponseInputItemList,
    ResponseObject,
)
from conductor_api.responses_store import continued, stored_response
from conductor_api.rules import CHAT_FIELDS, Caller
from conductor_api.schemas import EVENT_STREAM, ChatMessageIn, EventView
from conductor_api.service import WorkflowService
from conductor_api.sse import STREAM_HEADERS
from conductor_api.tools import tool_use

router = APIRouter(tags=["OpenAI-compatible"])

RESPONSE_FIELDS = dataclasses.replace(CHAT_FIELDS, question="input")
MAX_ITEMS_PAGE = 100
# Settings a request may carry that do not change the answer: kept and echoed.
_ECHOED = (
    "tools",
    "temperature",
    "top_p",
    "max_output_tokens",
    "max_tool_calls",
    "top_logprobs",
    "parallel_tool_calls",
    "tool_choice",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "text",
)


# -- stored responses ---------------------------------------------------------------------------


async def _keep_passthrough(
    service: WorkflowService, stored: StoredResponse, result: StepCallResult
) -> StoredResponse:
    """Store a worker call's response with its answer (a workflow's answer is the workflow's)."""
    output = {
        "text": result.text,
        "tool_calls": [call.model_dump() for call in result.tool_calls],
        "finish_reason": finish_reason(result),
        "usage": responses_usage(result.usage),
        "conductor": passthrough_field(result),
    }
    stored = stored.model_copy(update={"output": output})
    await asyncio.to_thread(insert_response, service.engine, stored)
    return stored


# -- streams ------------------------------------------------------------------------------------


async def _workflow_stream(
    service: WorkflowService,
    stored: StoredResponse,
    timeout_s: float,
) -> AsyncIterator[str]:
    assert stored.workflow_id is not None
    workflow_id, tenant = stored.workflow_id, stored.tenant
    events = ResponseEvents(stored)
    start = {"workflow_id": str(workflow_id), "variant": stored.model, "status": "running"}
    snapshot = response_object(stored, status="in_progress", text=None, usage=None, conductor=start)
    opening = events.started(snapshot)
    progress = workflow_events(service, workflow_id, tenant, timeout_s, opening)
    source = service.runtime.answer_pieces
    merged = with_answer_text(source, workflow_id, progress, len(opening))
    rendered = _WorkflowLines(events)
    try:
        async with contextlib.aclosing(merged) as items:
            async for item in items:
                for line in rendered.lines(item):
                    yield line
        for line in rendered.text():  # its step's start was not told: the workflow has ended
            yield line
    except ApiError as timed_out:
        for event in events.failed(snapshot, "failed", timed_out.message):
            yield event
        return
    view = await service.ended(workflow_id, tenant)
    if view is None:
        for event in events.failed(snapshot, "failed", f"workflow {workflow_id} not found"):
            yield event
        return
    final = workflow_object(stored, view)
    if view.status != "completed":
        for event in events.failed(final, final["status"], workflow_failed(view).message):
            yield event
        return
    calls = [call.model_dump() for call in view.tool_calls]
    for line in events.answered(view.answer or "", final, calls):
        yield line


class _WorkflowLines:
    """A workflow's stream as Responses events: a stored event as an SSE comment and its facts
    as the reasoning item's summary parts; the answer's text as deltas. The text is held until
    the event of its step's start has been read (the embedded runtime stores progress behind
    the run), so the reasoning item tells everything that came before the answer began."""

    def __init__(self, events: ResponseEvents) -> None:
        self.events = events
        self.facts = ProgressFacts()
        self.held: list[str] = []

    def lines(self, item: str | EventView | AnswerText) -> list[str]:
        if isinstance(item, AnswerText):
            self.held.append(item.text)
            return self.text() if self.facts.answer_begun else []
        if isinstance(item, EventView):
            lines = [progress_comment(item), *self.events.progress(self.facts.event(item))]
            return lines + self.text() if self.facts.answer_begun else lines
        return [item]

    def text(self) -> list[str]:
        """The text held, as deltas (the reasoning item's end and the message's start first)."""
        lines = [line for text in self.held for line in self.events.text_delta(text)]
        self.held = []
        return lines


async def _passthrough_stream(
    service: WorkflowService, stored: StoredResponse, call: DirectCall
) -> AsyncIterator[str]:
    events = ResponseEvents(stored)
    snapshot = response_object(
        stored, status="in_progress", text=None, usage=None, conductor={"worker": stored.model}
    )
    for line in events.started(snapshot):
        yield line
    try:
        async for piece in call.stream():
            if isinstance(piece, str):
                for line in events.text_delta(piece):
                    yield line
            else:
                result = piece
    except ApiError as error:
        for line in events.failed(snapshot, "failed", error.message):
            yield line
        return
    stored = await _keep_passthrough(service, stored, result)
    calls = [call.model_dump() for call in result.tool_calls]
    for line in events.answered(result.text, passthrough_object(stored), calls):
        yield line


# -- routes -------------------------------------------------------------------------------------


@router.post(
    "/v1/responses",
    response_model=None,
    responses={
        200: {
            "model": ResponseObject,
            "description": "A response; with stream=true, Responses API server-sent events",
            "content": EVENT_STREAM,
        }
    },
)
async def create_response(
    body: ResponseCreateRequest, request: Request, service: ServiceDep, caller: CallerDep
) -> JSONResponse | StreamingResponse:
    """Answer the input with a workflow (model = a variant) or one worker (model = its name).
    Extra request field ``conductor: {pool, max_steps, cost_weight}``; extra response field
    ``conductor`` with the workflow id and its steps."""
    check_supported(body)
    answer_format = text_answer_format(body.text)
    tools = tool_use(body.tools, body.tool_choice, body.parallel_tool_calls, nested=False)
    items = input_items(body.input)
    history: list[dict[str, str]] = []
    if body.previous_response_id is not None:
        history = await continued(service, body.previous_response_id, caller.tenant)
    stored = StoredResponse(
        id=uuid.uuid4(),
        tenant=caller.tenant,
        model=body.model,
        workflow_id=None,
        store=body.store is not False,
        input_items=items,
        history=history,
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        settings={k: getattr(body, k) for k in _ECHOED if getattr(body, k) is not None},
        labels=labels_of(body),
        output=None,
        created_at=datetime.now(UTC),
    )
    messages = conversation(stored)
    passthrough = body.model in service.worker_names
    if passthrough:  # first: a worker this key may not call is a 404, whatever else is wrong
        check_passthrough(service, caller, body.model, body.conductor)
    check_tools(service, body.model if passthrough else None, tools, messages, "input")
    where = first_image(items) or "previous_response_id"  # else an earlier turn's image
    check_images(service.pool.get(body.model) if passthrough else None, messages, where)
    if passthrough:
        return await _passthrough(
            service, request, caller, body, stored, messages, answer_format, tools
        )
    if body.model not in service.variants:
        raise unknown_model(body.model)
    options = body.conductor
    started = await service.start_workflow(
        caller,
        question(messages),
        variant=body.model,
        pool=options.pool if options else None,
        max_steps=options.max_steps if options else None,
        cost_weight=options.cost_weight if options else None,
        metadata=stored.labels,
        fields=RESPONSE_FIELDS,
        answer_format=workflow_answer_format(answer_format, messages),
        tools=tools,
        stream_answer=bool(body.stream),
    )
    keep_limit_headers(request, started.limit_headers)
    workflow_id, timeout_s = started.workflow_id, started.timeout_s
    # A workflow's response has the workflow's id: it reads back from the workflow's row.
    stored = stored.model_copy(update={"id": workflow_id, "workflow_id": workflow_id})
    await asyncio.to_thread(insert_response, service.engine, stored)
    if body.stream:
        stream = _workflow_stream(service, stored, timeout_s)
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    view = await completed_workflow(
        service,
        workflow_id,
        caller.tenant,
        timeout_s,
        disconnected(request),
        submitted_now=not started.replayed,
    )
    return JSONResponse(workflow_object(stored, view))


async def _passthrough(
    service: WorkflowService,
    request: Request,
    caller: Caller,
    body: ResponseCreateRequest,
    stored: StoredResponse,
    messages: list[ChatMessageIn],
    answer_format: AnswerFormat | None,
    tools: ToolUse | None,
) -> JSONResponse | StreamingResponse:
    if not any(m.role == "user" for m in messages):
        raise invalid("input", "include at least one user message")
    try:
        worker_input = worker_messages(messages)
    except ApiError as error:  # the calls and outputs were checked as items: a broken pairing
        raise invalid("input", error.message) from None
    sampling = sampling_of(body.max_output_tokens, body.temperature)
    call, headers = await service.call_worker(
        caller,
        body.model,
        worker_input,
        answer_format=answer_format,
        tools=tools,
        sampling=sampling,
    )
    keep_limit_headers(request, headers)
    if body.stream:
        stream = _passthrough_stream(service, stored, call)
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    result = await call()
    stored = await _keep_passthrough(service, stored, result)
    return JSONResponse(passthrough_object(stored))


@router.get("/v1/responses/{response_id}", response_model=ResponseObject)
async def get_response(response_id: str, service: ServiceDep, caller: CallerDep) -> JSONResponse:
    """A stored response as it is now: in progress while its workflow runs, then its answer."""
    stored = await stored_response(service, response_id, caller.tenant)
    if stored.workflow_id is None:
        return JSONResponse(passthrough_object(stored))
    view = await service.read(stored.workflow_id, caller.tenant)
    if view is None:
        raise not_found(f"response {response_id!r}")
    return JSONResponse(workflow_object(stored, view))


@router.delete("/v1/responses/{response_id}", response_model=ResponseDeleted)
async def remove_response(
    response_id: str, service: ServiceDep, caller: CallerDep
) -> ResponseDeleted:
    """Delete a stored response: it can no longer be read or continued, and what it was asked
    is dropped; its workflow (if any) keeps running and its trace stays for audit."""
    stored = await stored_response(service, response_id, caller.tenant)
    deleted = await asyncio.to_thread(delete_response, service.engine, stored.id, caller.tenant)
    if not deleted:  # deleted meanwhile
        raise not_found(f"response {response_id!r}")
    return ResponseDeleted(id=response_id)


@router.get("/v1/responses/{response_id}/input_items", response_model=ResponseInputItemList)
async def list_input_items(
    response_id: str,
    request: Request,
    service: ServiceDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=MAX_ITEMS_PAGE, description="Items per page.")] = 20,
    order: Annotated[
        Literal["asc", "desc"], Query(description="desc (default): the last item first.")
    ] = "desc",
    after: Annotated[
        str | None, Query(max_length=64, description="An item id: the page starts after it.")
    ] = None,
) -> JSONResponse:
    """The response's input items (not the earlier responses' it continues), a page at a time."""
    _refuse_include(request)
    stored = await stored_response(service, response_id, caller.tenant)
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid("after", f"no input item {after!r} in response {response_id!r}")
        start = ids.index(after) + 1
    page = items[start : start + limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items),
        }
    )


def _refuse_include(request: Request) -> None:
    """``include`` (the SDKs send ``include[]``) asks for more than an input item holds: a 400
    rather than a page without what was asked for."""
    for key in ("include", "include[]"):
        if any(request.query_params.getlist(key)):
            raise unsupported("include", "an input item holds its text only; leave it out")


# /v1/completions and /v1/responses/input_tokens come with this router (app.py includes it).
router.include_router(completions.router)
router.include_router(responses_tokens.router)
