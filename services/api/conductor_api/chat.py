"""``/v1/chat/completions`` and ``/v1/models``: the OpenAI-compatible surface.

The model is a variant (a workflow the Conductor writes) or one worker's name (a plain
pass-through call). A workflow's answer is its final step's answer; ``usage`` counts every
token the workflow spent (Conductor calls and all steps), and the extra ``conductor`` field
carries the workflow id and its steps. Streams send the answer when the workflow finishes
(progress comes as SSE comments meanwhile), then the usage chunk if asked, then ``[DONE]``.

The routes translate: what to start or call, and whether it may, is the service's
(``conductor_api.service``). ``answer_chat`` writes its answer in a ``ChatFormat``: the
chat.completion objects here, text_completion objects for ``/v1/completions``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conductor.answer_format import AnswerFormat
from conductor.chat import ToolCall, ToolUse
from conductor_api.admission import keep_limit_headers
from conductor_api.answers import (
    AnswerText,
    completed_workflow,
    disconnected,
    with_answer_text,
    workflow_progress,
)
from conductor_api.auth import CallerDep, ServiceDep
from conductor_api.chat_request import ChatCompletionRequest
from conductor_api.direct_calls import DirectCall
from conductor_api.errors import ApiError, error_body, unknown_model
from conductor_api.images import check_images
from conductor_api.openai_shared import (
    answer_format_of,
    check_passthrough,
    check_tools,
    conductor_field,
    finish_reason,
    openai_usage,
    passthrough_field,
    render_question,
    sampling_of,
    worker_messages,
    workflow_answer_format,
    workflow_failed,
)
from conductor_api.request_policy import check_chat
from conductor_api.rules import CHAT_FIELDS, Caller
from conductor_api.schemas import EVENT_STREAM, ChatCompletion, ModelCard, ModelList
from conductor_api.service import WorkflowService
from conductor_api.sse import STREAM_HEADERS, data_line
from conductor_api.tools import chat_tool_calls_out, tool_use

router = APIRouter(tags=["OpenAI-compatible"])
DONE = "data: [DONE]\n\n"


class ChatFormat:
    """Writes one answer as ``chat.completion`` objects, whole or as chunks. Its values are
    JSON already, so a whole one is sent as it is rather than through FastAPI's encoder,
    which walks every value again (a cost per request)."""

    prefix = "chatcmpl-"

    def __init__(self, id_hex: str, model: str, created: int) -> None:
        self.id = self.prefix + id_hex
        self.model = model
        self.created = created

    def whole(
        self,
        text: str,
        usage: dict[str, Any],
        extra: Any,
        tool_calls: list[ToolCall] | None = None,
        finish: str = "stop",
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if tool_calls:
            message.update(content=text or None, tool_calls=chat_tool_calls_out(tool_calls))
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
            "conductor": extra,
        }

    def _head(self) -> dict[str, Any]:
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created}
        return {**head, "model": self.model}

    def delta(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return data_line({**self._head(), "choices": [choice], **extra})

    def usage(self, usage: dict[str, Any]) -> str:
        return data_line({**self._head(), "choices": [], "usage": usage})


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={
        200: {
            "model": ChatCompletion,
            "description": "A chat.completion; with stream=true, chat.completion.chunk events",
            "content": EVENT_STREAM,
        }
    },
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, service: ServiceDep, caller: CallerDep
) -> JSONResponse | StreamingResponse:
    """Answer the messages with a workflow (model = a variant) or one worker (model = its
    name). Extra request field ``conductor: {pool, max_steps, cost_weight}``; extra response field
    ``conductor`` with the workflow id and its steps."""
    return await answer_chat(body, request, service, caller, ChatFormat)


async def answer_chat(
    body: ChatCompletionRequest,
    request: Request,
    service: WorkflowService,
    caller: Caller,
    form: type[ChatFormat],
) -> JSONResponse | StreamingResponse:
    """The answer to a chat completion request, written in ``form``."""
    created = int(time.time())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    check_chat(body)
    answer_format = answer_format_of(body.response_format)
    tools = tool_use(body.tools, body.tool_choice, body.parallel_tool_calls, nested=True)
    passthrough = body.model in service.worker_names
    if passthrough:  # first: a worker this key may not call is a 404, whatever else is wrong
        check_passthrough(service, caller, body.model, body.conductor)
    check_tools(service, body.model if passthrough else None, tools, body.messages)
    check_images(service.pool.get(body.model) if passthrough else None, body.messages)
    if passthrough:
        return await _passthrough(
            service, request, caller, body, form, created, include_usage, answer_format, tools
        )
    if body.model not in service.variants:
        raise unknown_model(body.model)
    options = body.conductor
    started = await service.start_workflow(
        caller,
        render_question(body.messages),
        variant=body.model,
        pool=options.pool if options else None,
        max_steps=options.max_steps if options else None,
        cost_weight=options.cost_weight if options else None,
        metadata=body.metadata,
        fields=CHAT_FIELDS,
        answer_format=workflow_answer_format(answer_format, body.messages),
        tools=tools,
        stream_answer=bool(body.stream),
    )
    keep_limit_headers(request, started.limit_headers)
    workflow_id, timeout_s = started.workflow_id, started.timeout_s
    out = form(workflow_id.hex, body.model, created)
    if body.stream:
        stream = _workflow_stream(
            service, caller.tenant, workflow_id, out, include_usage, timeout_s
        )
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    view = await completed_workflow(
        service,
        workflow_id,
        caller.tenant,
        timeout_s,
        disconnected(request),
        submitted_now=not started.replayed,
    )
    usage = openai_usage(view.usage)
    finish = "tool_calls" if view.tool_calls else "stop"
    whole = out.whole(view.answer or "", usage, conductor_field(view), view.tool_calls, finish)
    return JSONResponse(whole)


async def _workflow_stream(
    service: WorkflowService,
    tenant: str,
    workflow_id: uuid.UUID,
    out: ChatFormat,
    include_usage: bool,
    timeout_s: float,
) -> AsyncIterator[str]:
    start = {"workflow_id": str(workflow_id), "status": "running"}
    role = out.delta({"role": "assistant", "content": ""}, conductor=start)
    progress = workflow_progress(service, workflow_id, tenant, timeout_s, [role])
    merged = with_answer_text(service.runtime.answer_pieces, workflow_id, progress, 1)
    streamed = False  # the answer's text went out as it was written
    try:
        async with contextlib.aclosing(merged) as lines:
            async for line in lines:
                if isinstance(line, AnswerText):
                    streamed = True
                    yield out.delta({"content": line.text})
                else:
                    yield line
    except ApiError as timed_out:
        yield data_line(error_body(timed_out.status, timed_out.message, code=timed_out.code))
        yield DONE
        return
    view = await service.ended(workflow_id, tenant)
    if view is None or view.status != "completed":
        error = workflow_failed(view) if view else ApiError(404, "workflow not found")
        yield data_line(error_body(error.status, error.message, code=error.code))
        yield DONE
        return
    if not streamed and (view.answer or not view.tool_calls):
        yield out.delta({"content": view.answer or ""})
    for line in _call_deltas(out, view.tool_calls):
        yield line
    finish = "tool_calls" if view.tool_calls else "stop"
    yield out.delta({}, finish=finish, conductor=conductor_field(view))
    if include_usage:
        yield out.usage(openai_usage(view.usage))
    yield DONE


def _call_deltas(out: ChatFormat, calls: list[ToolCall]) -> Iterator[str]:
    """Tool calls as streamed chunks: each call whole, numbered as the SDKs assemble them."""
    if calls:
        listed = chat_tool_calls_out(calls)
        yield out.delta({"tool_calls": [{"index": i, **c} for i, c in enumerate(listed)]})


async def _passthrough(
    service: WorkflowService,
    request: Request,
    caller: Caller,
    body: ChatCompletionRequest,
    form: type[ChatFormat],
    created: int,
    include_usage: bool,
    answer_format: AnswerFormat | None = None,
    tools: ToolUse | None = None,
) -> JSONResponse | StreamingResponse:
    out = form(uuid.uuid4().hex, body.model, created)
    messages = worker_messages(body.messages)
    sampling = sampling_of(body.max_completion_tokens or body.max_tokens, body.temperature)
    call, headers = await service.call_worker(
        caller, body.model, messages, answer_format=answer_format, tools=tools, sampling=sampling
    )
    keep_limit_headers(request, headers)
    if body.stream:
        stream = _passthrough_stream(call, out, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    result = await call()
    usage = openai_usage(result.usage)
    whole = out.whole(
        result.text,
        usage,
        passthrough_field(result),
        result.tool_calls,
        finish_reason(result),
    )
    return JSONResponse(whole)


async def _passthrough_stream(
    call: DirectCall, out: ChatFormat, include_usage: bool
) -> AsyncIterator[str]:
    yield out.delta({"role": "assistant", "content": ""})
    streamed = False  # the text went out as the worker wrote it
    try:
        async for piece in call.stream():
            if isinstance(piece, str):
                streamed = True
                yield out.delta({"content": piece})
            else:
                result = piece
    except ApiError as error:
        yield data_line(error_body(error.status, error.message, code=error.code))
        yield DONE
        return
    if result.text and not streamed:
        yield out.delta({"content": result.text})
    for line in _call_deltas(out, result.tool_calls):
        yield line
    yield out.delta({}, finish=finish_reason(result), conductor=passthrough_field(result))
    if include_usage:
        yield out.usage(openai_usage(result.usage))
    yield DONE


@router.get("/v1/models", response_model=ModelList)
async def list_models(service: ServiceDep, caller: CallerDep) -> ModelList:
    """The variants, then the workers this key may call directly."""
    return ModelList(data=_cards(service, caller))


@router.get("/v1/models/{model}", response_model=ModelCard)
async def get_model(model: str, service: ServiceDep, caller: CallerDep) -> ModelCard:
    for card in _cards(service, caller):
        if card.id == model:
            return card
    raise unknown_model(model)


def _cards(service: WorkflowService, caller: Caller) -> list[ModelCard]:
    created = 0
    cards = [
        ModelCard(
            id=name,
            created=created,
            owned_by="conductor",
            kind="variant",
            description=p.description,
        )
        for name, p in service.variants.items()
    ]
    for name in service.allowed_workers(caller):
        spec = service.pool.get(name)
        cards.append(
            ModelCard(
                id=name,
                created=created,
                owned_by=spec.provider,
                kind="worker",
                description=spec.description,
            )
        )
    return cards
