"""``/v1/responses``: the OpenAI Responses API, on top of the same workflows as chat completions.

The model is a variant (a workflow the Conductor writes) or one worker's name (a plain
pass-through call), exactly as in chat completions. A workflow's response has the workflow's
id (``resp_<hex>``), its answer as the one output message, the workflow's usage, and the extra
``conductor`` field with the workflow and its steps. The input (a string or message items),
the ``instructions`` and, with ``previous_response_id``, the earlier response's input and
output become the question the Conductor gets, rendered as chat completions render a
conversation.

A response is stored unless ``store`` is false: it can then be read back, its input items
listed, continued, and deleted (its workflow's trace stays). Whatever Conductor cannot honour
(tools, images, files, reasoning options, structured output, background runs) is refused with
a 400 naming the field, never dropped; the fields the SDKs send by default with values that ask
for nothing are accepted.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conductor.chat import ChatMessage, Usage
from conductor.orchestration import MAX_QUESTION_CHARS
from conductor.ports import StepCallResult
from conductor_adapters.store.responses import (
    StoredResponse,
    delete_response,
    insert_response,
    load_response,
)
from conductor_api import completions
from conductor_api.admission import admit, request_state
from conductor_api.auth import CallerDep
from conductor_api.chat import (
    WAIT_MARGIN_S,
    _call,
    _cancel_in_background,
    _outcome,
    _passthrough_field,
    _unknown_model,
    _workflow_failed,
    conductor_field,
    openai_usage,
    render_question,
)
from conductor_api.errors import ApiError, not_found
from conductor_api.metrics import ApiMetrics
from conductor_api.reads import load_workflow
from conductor_api.responses_schemas import (
    ResponseCreateRequest,
    ResponseDeleted,
    ResponseInputItemList,
    ResponseObject,
)
from conductor_api.schemas import EVENT_STREAM, MAX_MESSAGES, ChatMessageIn, UsageView, WorkflowView
from conductor_api.service import Caller, SubmitFields, WorkflowService
from conductor_api.sse import KEEPALIVE, STREAM_HEADERS, with_keepalive

router = APIRouter(tags=["OpenAI-compatible"])

RESPONSE_FIELDS = SubmitFields(
    question="input",
    variant="model",
    pool="conductor.pool",
    max_steps="conductor.max_steps",
    cost_weight="conductor.cost_weight",
)
ROLES = ("user", "system", "developer", "assistant")
Role = Literal["user", "system", "developer", "assistant"]
TEXT_PARTS = ("input_text", "output_text")
MAX_ITEMS_PAGE = 100
# A workflow's status, as a response's.
_STATUS = {
    "queued": "queued",
    "running": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
# Settings a request may carry that do not change the answer: kept and echoed.
_ECHOED = (
    "temperature",
    "top_p",
    "max_output_tokens",
    "parallel_tool_calls",
    "tool_choice",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
)


# -- what the request asks for ------------------------------------------------------------------


def _unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", code="unsupported_parameter", param=param)


def _blank(value: Any) -> bool:
    """An object that asks for nothing: null, or a mapping whose values are all null."""
    return value is None or (isinstance(value, dict) and all(v is None for v in value.values()))


def check_supported(body: ResponseCreateRequest) -> None:
    """Refuse, with a 400 naming it, every field Conductor cannot honour unless it carries a
    value that asks for nothing; and every field the API does not know."""
    for name in body.model_extra or {}:
        raise ApiError(400, f"{name}: unknown parameter", code="unknown_parameter", param=name)
    if body.tools:
        raise _unsupported(
            "tools",
            "tools are not supported: a workflow's workers answer with text and no tool call "
            "comes back to the client; send [] or leave it out",
        )
    if body.tool_choice not in (None, "auto", "none"):
        raise _unsupported("tool_choice", 'with no tools, only "auto" or "none"')
    if body.truncation not in (None, "disabled"):
        raise _unsupported(
            "truncation",
            'only "disabled": a conversation over the limit is refused, never cut',
        )
    if body.include:
        raise _unsupported(
            "include",
            f"{body.include[0]!r} cannot be included: a response holds its text and usage only; "
            "send [] or leave it out",
        )
    _check_text(body.text)
    if not _blank(body.reasoning):
        raise _unsupported(
            "reasoning",
            "reasoning options are not supported: each worker runs with the settings of the "
            "pool file",
        )
    if body.background not in (None, False):
        raise _unsupported(
            "background",
            "background responses are not supported: submit the question to the job API "
            "(POST /v1/workflows) to run it without waiting",
        )
    if body.service_tier not in (None, "auto", "default"):
        raise _unsupported("service_tier", 'only "auto" or "default"')
    if body.top_logprobs is not None and not (
        type(body.top_logprobs) is int and body.top_logprobs == 0
    ):
        raise _unsupported("top_logprobs", "log probabilities are not available from a workflow")
    refused = {
        "conversation": "conversations are not supported; continue with previous_response_id",
        "prompt": "prompt templates are not supported; send the input",
        "context_management": "context management is not supported",
        "moderation": "moderation is not supported",
        "prompt_cache_options": "prompt cache options are not supported",
        "prompt_cache_retention": "prompt cache retention is not supported",
    }
    for name, why in refused.items():
        if not _blank(getattr(body, name)):
            raise _unsupported(name, why)


def _check_text(text: Any) -> None:
    if _blank(text):
        return
    if not isinstance(text, dict):
        raise _unsupported("text", 'only {"format": {"type": "text"}}')
    for key, value in text.items():
        if key == "format":
            if value is not None and value != {"type": "text"}:
                kind = value.get("type") if isinstance(value, dict) else value
                raise _unsupported(
                    "text.format",
                    f"{kind!r} output is not supported: a workflow answers with plain text; "
                    'only {"type": "text"}',
                )
        elif key == "verbosity":
            if value not in (None, "medium"):
                raise _unsupported("text.verbosity", "verbosity cannot be set on a workflow")
        else:
            raise ApiError(
                400, f"text.{key}: unknown parameter", code="unknown_parameter", param=f"text.{key}"
            )


def _invalid(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param)


def _part_text(part: Any, param: str) -> str:
    if not isinstance(part, dict):
        raise _invalid(param, "expected a content part object")
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise _invalid(f"{param}.text", "expected a string")
        return _checked_text(text, f"{param}.text")
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return _checked_text(part["refusal"], f"{param}.refusal")
    if isinstance(kind, str) and kind:
        raise _unsupported(
            param, f"{kind} parts are not supported: a workflow takes text parts only"
        )
    raise _invalid(f"{param}.type", 'expected "input_text" or "output_text"')


def _checked_text(text: str, param: str) -> str:
    if len(text) > MAX_QUESTION_CHARS:
        raise _invalid(param, f"longer than {MAX_QUESTION_CHARS} characters")
    if "\x00" in text:
        raise _invalid(param, "must not contain a NUL character (\\u0000)")
    return text


def _message(item: Any, index: int) -> dict[str, Any]:
    """One input item as stored: a message with an id and text parts."""
    param = f"input.{index}"
    if not isinstance(item, dict):
        raise _invalid(param, "expected an input item object")
    kind = item.get("type", "message")
    if kind == "item_reference":
        raise _unsupported(
            param, "item references are not supported; send the message or previous_response_id"
        )
    if kind != "message":
        raise _unsupported(
            f"{param}.type",
            f"{kind!r} items are not supported: a workflow takes messages only "
            "(no tool calls, tool outputs or reasoning items)",
        )
    role = item.get("role")
    if role not in ROLES:
        raise _invalid(f"{param}.role", f"expected one of {', '.join(ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        texts = [_checked_text(content, f"{param}.content")]
    elif isinstance(content, list) and content:
        if len(content) > MAX_MESSAGES:
            raise _invalid(f"{param}.content", f"at most {MAX_MESSAGES} parts")
        texts = [_part_text(p, f"{param}.content.{i}") for i, p in enumerate(content)]
    else:
        raise _invalid(f"{param}.content", "expected a string or a list of text parts")
    part_type = "output_text" if role == "assistant" else "input_text"
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [{"type": part_type, "text": t} for t in texts],
    }


def input_items(raw: Any) -> list[dict[str, Any]]:
    """The request's input as stored messages; a 400 naming the item and part at fault."""
    if isinstance(raw, str):
        return [_message({"role": "user", "content": raw}, 0)]
    if not isinstance(raw, list) or not raw:
        raise _invalid("input", "expected a string or a non-empty list of input items")
    if len(raw) > MAX_MESSAGES:
        raise _invalid("input", f"at most {MAX_MESSAGES} items, not {len(raw)}")
    return [_message(item, i) for i, item in enumerate(raw)]


def _item_text(item: dict[str, Any]) -> str:
    return "".join(str(part.get("text", "")) for part in item.get("content", []))


def _turns(items: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": item["role"], "content": _item_text(item)} for item in items]


def _conversation(stored: StoredResponse) -> list[ChatMessageIn]:
    """Instructions, the earlier conversation, then this input, as chat messages."""
    turns = []
    if stored.instructions:
        turns.append({"role": "system", "content": stored.instructions})
    turns += stored.history + _turns(stored.input_items)
    # Built without validation: an earlier answer may be longer than one message may be; the
    # question as a whole is checked when the workflow is submitted.
    return [
        ChatMessageIn.model_construct(role=cast(Role, t["role"]), content=t["content"])
        for t in turns
    ]


def _question(messages: list[ChatMessageIn]) -> str:
    try:
        return render_question(messages)
    except ApiError as error:
        if error.param != "messages":
            raise
        raise _invalid("input", "include at least one user message") from None


# -- ids and stored responses -------------------------------------------------------------------


def response_id(value: uuid.UUID) -> str:
    return f"resp_{value.hex}"


def _parse_id(value: str) -> uuid.UUID | None:
    if not value.startswith("resp_") or len(value) != 37:
        return None
    try:
        return uuid.UUID(hex=value[5:])
    except ValueError:
        return None


async def _stored(
    service: WorkflowService, value: str, tenant: str, param: str | None = None
) -> StoredResponse:
    """The tenant's stored response; 404 for another tenant's, a deleted one, or one sent with
    store=false."""
    parsed = _parse_id(value)
    found = None
    if parsed is not None:
        found = await asyncio.to_thread(load_response, service.engine, parsed, tenant)
    if found is None or found.deleted_at is not None:
        error = not_found(f"response {value!r}")
        error.param = param
        raise error
    if not found.store:
        raise ApiError(
            404,
            f"response {value!r} was created with store=false: it is not kept, so it cannot be "
            "read back or continued",
            code="not_found",
            param=param,
        )
    return found


async def _answer_of(service: WorkflowService, stored: StoredResponse) -> tuple[str | None, str]:
    """A stored response's answer (None while it has none) and its status."""
    if stored.workflow_id is None:
        return (stored.output or {}).get("text"), "completed"
    view = await asyncio.to_thread(load_workflow, service.engine, stored.workflow_id, stored.tenant)
    if view is None:
        return None, "failed"
    return view.answer if view.status == "completed" else None, _STATUS[view.status]


async def _continued(
    service: WorkflowService, previous_id: str, tenant: str
) -> list[dict[str, str]]:
    """The conversation a response continues: the earlier one's, its input and its answer."""
    previous = await _stored(service, previous_id, tenant, param="previous_response_id")
    answer, status = await _answer_of(service, previous)
    if status in ("queued", "in_progress"):
        raise ApiError(
            400,
            f"previous_response_id: response {previous_id!r} is still in progress; continue it "
            "once it has finished",
            code="previous_response_in_progress",
            param="previous_response_id",
        )
    turns = previous.history + _turns(previous.input_items)
    if answer is not None:
        turns.append({"role": "assistant", "content": answer})
    return turns


# -- response objects ---------------------------------------------------------------------------


def responses_usage(usage: UsageView | Usage) -> dict[str, Any]:
    """Usage as the Responses API writes it, from chat completions' own."""
    chat = openai_usage(usage)
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": chat["completion_tokens_details"]["reasoning_tokens"]
        },
        "total_tokens": chat["total_tokens"],
    }


def _output_item(stored: StoredResponse, text: str, status: str) -> dict[str, Any]:
    return {
        "id": f"msg_{stored.id.hex}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if status == "in_progress" else [_text_part(text)],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_object(
    stored: StoredResponse,
    *,
    status: str,
    text: str | None,
    usage: dict[str, Any] | None,
    conductor: dict[str, Any],
    error: str | None = None,
    completed_at: datetime | None = None,
) -> dict[str, Any]:
    settings = stored.settings
    return {
        "id": response_id(stored.id),
        "object": "response",
        "created_at": int(stored.created_at.timestamp()),
        "completed_at": int(completed_at.timestamp()) if completed_at else None,
        "status": status,
        "model": stored.model,
        "output": [] if text is None else [_output_item(stored, text, "completed")],
        "usage": usage,
        "error": None if error is None else {"code": "server_error", "message": error},
        "incomplete_details": None,
        "instructions": stored.instructions,
        "previous_response_id": stored.previous_response_id,
        "metadata": stored.labels,
        "store": stored.store,
        "max_output_tokens": settings.get("max_output_tokens"),
        "temperature": settings.get("temperature"),
        "top_p": settings.get("top_p"),
        "parallel_tool_calls": settings.get("parallel_tool_calls", True),
        "tool_choice": settings.get("tool_choice", "auto"),
        "tools": [],
        "truncation": "disabled",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "reasoning": {"effort": None, "summary": None},
        "background": False,
        "service_tier": settings.get("service_tier", "default"),
        "user": settings.get("user"),
        "safety_identifier": settings.get("safety_identifier"),
        "prompt_cache_key": settings.get("prompt_cache_key"),
        "conductor": conductor,
    }


def _workflow_object(stored: StoredResponse, view: WorkflowView) -> dict[str, Any]:
    completed = view.status == "completed"
    return response_object(
        stored,
        status=_STATUS[view.status],
        text=view.answer or "" if completed else None,
        usage=responses_usage(view.usage),
        conductor=conductor_field(view),
        error=_workflow_failed(view).message if view.status in ("failed", "cancelled") else None,
        completed_at=view.finished_at if completed else None,
    )


def _passthrough_object(stored: StoredResponse) -> dict[str, Any]:
    output = stored.output or {}
    return response_object(
        stored,
        status="completed",
        text=output.get("text", ""),
        usage=output.get("usage"),
        conductor=output.get("conductor", {}),
        completed_at=stored.created_at,
    )


# -- streams --------------------------------------------------------------------------------


class _Events:
    """The events of one streamed response, numbered from 0 as the Responses API numbers them."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        body = json.dumps(payload, ensure_ascii=False, default=str)
        return f"event: {kind}\ndata: {body}\n\n"

    def started(self, snapshot: dict[str, Any]) -> list[str]:
        return [
            self("response.created", response=snapshot),
            self("response.in_progress", response=snapshot),
        ]

    def answered(self, stored: StoredResponse, text: str, final: dict[str, Any]) -> list[str]:
        """From the output item's start to ``response.completed``."""
        item_id = f"msg_{stored.id.hex}"
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        return [
            self(
                "response.output_item.added",
                output_index=0,
                item=_output_item(stored, "", "in_progress"),
            ),
            self("response.content_part.added", **where, part=_text_part("")),
            self("response.output_text.delta", **where, delta=text, logprobs=[]),
            self("response.output_text.done", **where, text=text, logprobs=[]),
            self("response.content_part.done", **where, part=_text_part(text)),
            self(
                "response.output_item.done",
                output_index=0,
                item=_output_item(stored, text, "completed"),
            ),
            self("response.completed", response=final),
        ]

    def failed(self, snapshot: dict[str, Any], status: str, message: str) -> str:
        failed = {
            **snapshot,
            "status": status,
            "error": {"code": "server_error", "message": message},
        }
        return self("response.failed", response=failed)


async def _workflow_stream(
    service: WorkflowService,
    metrics: ApiMetrics,
    stored: StoredResponse,
    timeout_s: float,
) -> AsyncIterator[str]:
    assert stored.workflow_id is not None
    workflow_id, tenant = stored.workflow_id, stored.tenant
    events = _Events()
    start = {"workflow_id": str(workflow_id), "variant": stored.model, "status": "running"}
    snapshot = response_object(stored, status="in_progress", text=None, usage=None, conductor=start)
    finished = False
    try:
        for line in events.started(snapshot):
            yield line
        async with asyncio.timeout(timeout_s):
            async for event in with_keepalive(service.follow(workflow_id, tenant)):
                if event is None:
                    yield KEEPALIVE
                else:  # progress, as a comment: SDKs skip it, curl shows it
                    yield f": {event.kind} {event.sequence}\n\n"
        finished = True
    except TimeoutError:
        finished = True
        message = f"workflow {workflow_id} did not finish within {timeout_s:g} s"
        yield events.failed(snapshot, "failed", message)
        return
    finally:
        if not finished:  # the client went away (the server closes the stream) or it broke
            _cancel_in_background(service, workflow_id, tenant)
    view = await asyncio.to_thread(load_workflow, service.engine, workflow_id, tenant)
    if view is None:
        yield events.failed(snapshot, "failed", f"workflow {workflow_id} not found")
        return
    metrics.workflow(tenant, view)
    final = _workflow_object(stored, view)
    if view.status != "completed":
        yield events.failed(final, final["status"], _workflow_failed(view).message)
        return
    for line in events.answered(stored, view.answer or "", final):
        yield line


Call = Callable[[], Awaitable[StepCallResult]]


async def _passthrough_stream(
    service: WorkflowService, metrics: ApiMetrics, stored: StoredResponse, call: Call
) -> AsyncIterator[str]:
    events = _Events()
    snapshot = response_object(
        stored, status="in_progress", text=None, usage=None, conductor={"worker": stored.model}
    )
    for line in events.started(snapshot):
        yield line
    try:
        result = await _call(call, metrics, stored.model)
    except ApiError as error:
        yield events.failed(snapshot, "failed", error.message)
        return
    stored = await _keep_passthrough(service, stored, result)
    for line in events.answered(stored, result.text, _passthrough_object(stored)):
        yield line


async def _keep_passthrough(
    service: WorkflowService, stored: StoredResponse, result: StepCallResult
) -> StoredResponse:
    output = {
        "text": result.text,
        "usage": responses_usage(result.usage),
        "conductor": _passthrough_field(result),
    }
    stored = stored.model_copy(update={"output": output})
    await asyncio.to_thread(insert_response, service.engine, stored)
    return stored


# -- routes ---------------------------------------------------------------------------------


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
    body: ResponseCreateRequest, request: Request, caller: CallerDep
) -> JSONResponse | StreamingResponse:
    """Answer the input with a workflow (model = a variant) or one worker (model = its name).
    Extra request field ``conductor: {pool, max_steps, cost_weight}``; extra response field
    ``conductor`` with the workflow id and its steps."""
    service: WorkflowService = request.app.state.service
    metrics: ApiMetrics = request.app.state.metrics
    check_supported(body)
    items = input_items(body.input)
    history: list[dict[str, str]] = []
    if body.previous_response_id is not None:
        history = await _continued(service, body.previous_response_id, caller.tenant)
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
        labels=dict(body.metadata or {}),
        output=None,
        created_at=datetime.now(UTC),
    )
    messages = _conversation(stored)
    passthrough = body.model in service.worker_names
    await admit(
        service, metrics, caller, starts_workflow=not passthrough, state=request_state(request)
    )
    if passthrough:
        return await _passthrough(service, metrics, caller, body, stored, messages)
    if body.model not in service.variants:
        raise _unknown_model(body.model)
    options = body.conductor
    submission = service.submission(
        caller,
        _question(messages),
        variant=body.model,
        pool=options.pool if options else None,
        max_steps=options.max_steps if options else None,
        cost_weight=options.cost_weight if options else None,
        metadata=body.metadata,
        fields=RESPONSE_FIELDS,
    )
    workflow_id = await service.submit(submission)
    metrics.workflows.labels(submission.variant.name).inc()
    stored = stored.model_copy(update={"id": workflow_id, "workflow_id": workflow_id})
    await asyncio.to_thread(insert_response, service.engine, stored)
    timeout_s = submission.variant.workflow_timeout_s + WAIT_MARGIN_S
    if body.stream:
        stream = _workflow_stream(service, metrics, stored, timeout_s)
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    view = await _outcome(service, workflow_id, caller.tenant, timeout_s, request)
    metrics.workflow(caller.tenant, view)
    if view.status != "completed":
        raise _workflow_failed(view)
    return JSONResponse(_workflow_object(stored, view))


async def _passthrough(
    service: WorkflowService,
    metrics: ApiMetrics,
    caller: Caller,
    body: ResponseCreateRequest,
    stored: StoredResponse,
    messages: list[ChatMessageIn],
) -> JSONResponse | StreamingResponse:
    if body.model not in service.allowed_workers(caller):
        raise _unknown_model(body.model)
    if body.conductor is not None:
        raise ApiError(
            400,
            f"conductor options apply to variants; {body.model!r} is a single worker",
            param="conductor",
        )
    if not any(m.role == "user" for m in messages):
        raise _invalid("input", "include at least one user message")
    chat = [
        ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text)
        for m in messages
    ]

    def call() -> Awaitable[StepCallResult]:  # started inside the stream, if streaming
        return service.passthrough(body.model, chat, allowed_workers=caller.allowed_pool)

    if body.stream:
        stream = _passthrough_stream(service, metrics, stored, call)
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    result = await _call(call, metrics, body.model)
    stored = await _keep_passthrough(service, stored, result)
    return JSONResponse(_passthrough_object(stored))


@router.get("/v1/responses/{response_id}", response_model=ResponseObject)
async def get_response(response_id: str, request: Request, caller: CallerDep) -> JSONResponse:
    """A stored response as it is now: in progress while its workflow runs, then its answer."""
    service: WorkflowService = request.app.state.service
    stored = await _stored(service, response_id, caller.tenant)
    if stored.workflow_id is None:
        return JSONResponse(_passthrough_object(stored))
    view = await asyncio.to_thread(load_workflow, service.engine, stored.workflow_id, caller.tenant)
    if view is None:
        raise not_found(f"response {response_id!r}")
    return JSONResponse(_workflow_object(stored, view))


@router.delete("/v1/responses/{response_id}", response_model=ResponseDeleted)
async def remove_response(response_id: str, request: Request, caller: CallerDep) -> ResponseDeleted:
    """Delete a stored response: it can no longer be read or continued, and what it was asked
    is dropped; its workflow (if any) keeps running and its trace stays for audit."""
    service: WorkflowService = request.app.state.service
    stored = await _stored(service, response_id, caller.tenant)
    deleted = await asyncio.to_thread(delete_response, service.engine, stored.id, caller.tenant)
    if not deleted:  # deleted meanwhile
        raise not_found(f"response {response_id!r}")
    return ResponseDeleted(id=response_id)


@router.get("/v1/responses/{response_id}/input_items", response_model=ResponseInputItemList)
async def list_input_items(
    response_id: str,
    request: Request,
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
    service: WorkflowService = request.app.state.service
    stored = await _stored(service, response_id, caller.tenant)
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise _invalid("after", f"no input item {after!r} in response {response_id!r}")
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


# /v1/completions comes with this router (app.py includes this one).
router.include_router(completions.router)
