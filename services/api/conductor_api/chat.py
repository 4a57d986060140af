"""``/v1/chat/completions`` and ``/v1/models``: the OpenAI-compatible surface.

The model is a variant (a workflow the Conductor writes) or one worker's name (a plain
pass-through call). A workflow's answer is its final step's answer; ``usage`` counts every
token the workflow spent (Conductor calls and all steps), and the extra ``conductor`` field
carries the workflow id and its steps. Streams send the answer when the workflow finishes
(progress comes as SSE comments meanwhile), then the usage chunk if asked, then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.exc import SQLAlchemyError

from conductor.answer_format import AnswerFormat, AnswerFormatError
from conductor.chat import ChatMessage, Sampling, ToolCall, ToolUse, Usage
from conductor.errors import StepCallFailed
from conductor.ports import StepCallResult
from conductor.workflow import AttemptRecord, attempts_total
from conductor_adapters.store.keys import record_direct_call
from conductor_adapters.store.redact import without_addresses
from conductor_api.admission import admit, request_state
from conductor_api.auth import CallerDep
from conductor_api.chat_request import ChatCompletionRequest
from conductor_api.errors import ApiError, error_body
from conductor_api.images import check_images, message_images
from conductor_api.metrics import ApiMetrics
from conductor_api.reads import load_workflow
from conductor_api.request_policy import check_chat
from conductor_api.schemas import (
    EVENT_STREAM,
    ChatCompletion,
    ChatMessageIn,
    ConductorOptions,
    ModelCard,
    ModelList,
    UsageView,
    WorkflowView,
)
from conductor_api.service import CHAT_FIELDS, Caller, SubmitFields, WorkflowService
from conductor_api.sse import KEEPALIVE, STREAM_HEADERS, data_line, with_keepalive
from conductor_api.tools import (
    chat_tool_calls,
    chat_tool_calls_out,
    describe_calls,
    refuse_for_worker,
    refuse_for_workflow,
    takes_tools,
    tool_use,
)

router = APIRouter(tags=["OpenAI-compatible"])
logger = logging.getLogger(__name__)
WAIT_MARGIN_S = 30.0  # beyond the variant's own deadline, for the outcome to be stored


def render_question(messages: list[ChatMessageIn]) -> str:
    """The question the Conductor gets: the last user message, with the instructions and the
    conversation around it when there are any (tool calls and their results included, as
    text: a workflow calls no client function)."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        raise ApiError(400, "messages: include at least one user message", param="messages")
    request = messages[last_user].text
    instructions = [m.text for m in messages if m.role in ("system", "developer")]
    turns = [(i, m) for i, m in enumerate(messages) if m.role not in ("system", "developer")]
    before = [_turn(m, i) for i, m in turns if i < last_user]
    after = [_turn(m, i) for i, m in turns if i > last_user]
    if not instructions and not before and not after:
        return request
    parts = []
    if instructions:
        parts.append("Instructions:\n" + "\n\n".join(instructions))
    if before:
        parts.append("Conversation so far:\n" + "\n".join(before))
    parts.append("Request:\n" + request)
    if after:
        parts.append("Since the request:\n" + "\n".join(after))
    return "\n\n".join(parts)


def _turn(message: ChatMessageIn, index: int) -> str:
    if message.role == "tool":
        return f"Tool result ({message.tool_call_id or 'a call'}): {message.text}"
    calls = chat_tool_calls(message.tool_calls, f"messages[{index}].tool_calls")
    text = "\n".join(t for t in (message.text, describe_calls(calls)) if t)
    return f"{message.role.title()}: {text}"


def openai_usage(usage: UsageView | Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def conductor_field(view: WorkflowView) -> dict[str, Any]:
    return {
        "workflow_id": str(view.id),
        "variant": view.variant,
        "status": view.status,
        "plan_valid": view.plan_valid,
        "steps": [
            {
                "index": s.index,
                "round": s.round,
                "kind": s.kind.value,
                "worker": s.worker,
                "subtask": s.subtask,
                "access_list": s.access_list,
                "status": s.status.value,
                "output": s.output,
                "error": s.error,
                "usage": openai_usage(s.usage),
                "cost_usd": s.cost_usd,
                "latency_ms": s.latency_ms,
            }
            for s in view.steps
        ],
        "cost_usd": view.cost_usd,
        "latency_ms": view.latency_ms,
        "error": view.error,
    }


def _completion(
    completion_id: str,
    model: str,
    created: int,
    text: str,
    usage: dict[str, Any],
    extra: Any,
    tool_calls: list[ToolCall] | None = None,
    finish: str = "stop",
) -> JSONResponse:
    """A ``chat.completion`` object. Its values are JSON already, so it is sent as it is rather
    than through FastAPI's encoder, which walks every value again (a cost per request)."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message.update(content=text or None, tool_calls=chat_tool_calls_out(tool_calls))
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": usage,
        "conductor": extra,
    }
    return JSONResponse(body)


class _Chunks:
    """Builds the ``chat.completion.chunk`` lines of one stream."""

    def __init__(self, completion_id: str, model: str, created: int) -> None:
        self.head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }

    def delta(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return data_line({**self.head, "choices": [choice], **extra})

    def usage(self, usage: dict[str, Any]) -> str:
        return data_line({**self.head, "choices": [], "usage": usage})


DONE = "data: [DONE]\n\n"


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
    body: ChatCompletionRequest, request: Request, caller: CallerDep
) -> JSONResponse | StreamingResponse:
    """Answer the messages with a workflow (model = a variant) or one worker (model = its
    name). Extra request field ``conductor: {pool, max_steps, cost_weight}``; extra response field
    ``conductor`` with the workflow id and its steps."""
    service: WorkflowService = request.app.state.service
    metrics: ApiMetrics = request.app.state.metrics
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
    await admit(
        service, metrics, caller, starts_workflow=not passthrough, state=request_state(request)
    )
    if passthrough:
        return await _passthrough(
            service, metrics, caller, body, created, include_usage, answer_format, tools
        )
    if body.model not in service.variants:
        raise unknown_model(body.model)
    question = render_question(body.messages)
    workflow_id, timeout_s = await submit_workflow(
        service,
        metrics,
        caller,
        question,
        model=body.model,
        options=body.conductor,
        metadata=body.metadata,
        fields=CHAT_FIELDS,
        answer_format=answer_format,
    )
    completion_id = f"chatcmpl-{workflow_id.hex}"
    if body.stream:
        chunks = _Chunks(completion_id, body.model, created)
        stream = _workflow_stream(
            service, metrics, caller.tenant, workflow_id, chunks, include_usage, timeout_s
        )
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    view = await completed_workflow(
        service, metrics, workflow_id, caller.tenant, timeout_s, request
    )
    usage = openai_usage(view.usage)
    return _completion(
        completion_id, body.model, created, view.answer or "", usage, conductor_field(view)
    )


async def submit_workflow(
    service: WorkflowService,
    metrics: ApiMetrics,
    caller: Caller,
    question: str,
    *,
    model: str,
    options: ConductorOptions | None,
    metadata: dict[str, str] | None,
    fields: SubmitFields,
    answer_format: AnswerFormat | None = None,
) -> tuple[uuid.UUID, float]:
    """Start a workflow of the variant ``model``: its id, and how long to wait for its answer
    (the variant's deadline and a margin)."""
    submission = service.submission(
        caller,
        question,
        variant=model,
        pool=options.pool if options else None,
        max_steps=options.max_steps if options else None,
        cost_weight=options.cost_weight if options else None,
        metadata=metadata,
        fields=fields,
        answer_format=answer_format,
    )
    workflow_id = await service.submit(submission)
    metrics.workflows.labels(submission.variant.name).inc()
    return workflow_id, submission.variant.workflow_timeout_s + WAIT_MARGIN_S


def check_tools(
    service: WorkflowService,
    worker: str | None,
    tools: ToolUse | None,
    messages: list[ChatMessageIn],
    messages_param: str | None = None,
) -> None:
    """Tools, tool calls and tool results where they have a meaning: on a direct call to a
    worker whose wire format carries them, or (tools with tool_choice "none", and calls and
    results as conversation) on a workflow; a 400 naming the field otherwise (a message by its
    index, or ``messages_param`` when given)."""
    if worker is None:
        if tools is not None and tools.choice != "none":
            raise refuse_for_workflow("tools")
        return
    spec = service.pool.get(worker)
    if takes_tools(spec):
        return
    if tools is not None:
        raise refuse_for_worker(spec, "tools")
    for i, message in enumerate(messages):
        if message.role == "tool" or message.tool_calls:
            raise refuse_for_worker(spec, messages_param or f"messages[{i}]")


def answer_format_of(response_format: Any) -> AnswerFormat | None:
    """The answer's required form from OpenAI's ``response_format`` (None: any text); a
    schema that is not one is refused here, before anything is counted or started."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return AnswerFormat(type="json_object")
    spec = response_format.json_schema
    answer_format = AnswerFormat(type="json_schema", name=spec.name, json_schema=spec.schema_)
    answer_format.check_schema("response_format")
    return answer_format


def unknown_model(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model {model!r} does not exist or you do not have access to it "
        "(GET /v1/models lists yours).",
        code="model_not_found",
        param="model",
    )


def workflow_timed_out(workflow_id: uuid.UUID, timeout_s: float) -> ApiError:
    message = f"workflow {workflow_id} did not finish within {timeout_s:g} s"
    return ApiError(504, message, code="timeout", retry=False)


def workflow_failed(view: WorkflowView) -> ApiError:
    reason = without_addresses(view.error or "no answer")
    message = f"workflow {view.id} failed: {reason}"
    return ApiError(502, message, code="workflow_failed", retry=False)


async def _wait_for_workflow(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    tenant: str,
    timeout_s: float,
    request: Request,
) -> WorkflowView:
    """The finished workflow; if the client goes away first, the workflow is cancelled (a chat
    request's answer has nobody else to go to: a job submitted to the job API runs on)."""
    outcome = asyncio.ensure_future(service.wait_for_outcome(workflow_id, tenant))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait({outcome, gone}, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        raise workflow_timed_out(workflow_id, timeout_s) from None
    finally:
        gone.cancel()
        if not outcome.done():
            outcome.cancel()
    if not outcome.done() or outcome.cancelled():
        await service.cancel(workflow_id, tenant, CLIENT_GONE)
    else:
        outcome.result()  # raises what the wait raised
    view = await asyncio.to_thread(load_workflow, service.engine, workflow_id, tenant)
    if view is None:  # deleted meanwhile
        raise ApiError(404, f"workflow {workflow_id} not found", code="not_found")
    return view


async def completed_workflow(
    service: WorkflowService,
    metrics: ApiMetrics,
    workflow_id: uuid.UUID,
    tenant: str,
    timeout_s: float,
    request: Request,
) -> WorkflowView:
    """The workflow once it has completed, counted in the metrics; a 502 if it did not."""
    view = await _wait_for_workflow(service, workflow_id, tenant, timeout_s, request)
    metrics.workflow(tenant, view)
    if view.status != "completed":
        raise workflow_failed(view)
    return view


CLIENT_GONE = "its client went away before the answer"
DISCONNECT_POLL_S = 0.5
# Cancels started for streams whose client went away, kept until they end (a task nobody
# holds can be collected before it runs).
_cancelling: set[asyncio.Task[None]] = set()


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed its connection. Polled: Starlette tells of a
    disconnect only when asked."""
    while not await request.is_disconnected():  # noqa: ASYNC110
        await asyncio.sleep(DISCONNECT_POLL_S)


def _cancel_in_background(service: WorkflowService, workflow_id: uuid.UUID, tenant: str) -> None:
    """Cancel from a stream the server is tearing down: in a task of its own, outside the
    stream's cancelled scope."""
    task = asyncio.get_running_loop().create_task(service.cancel(workflow_id, tenant, CLIENT_GONE))
    _cancelling.add(task)
    task.add_done_callback(_cancelling.discard)


async def workflow_progress(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    tenant: str,
    timeout_s: float,
    first: Iterable[str],
) -> AsyncGenerator[str, None]:
    """A workflow's stream until it finishes: ``first``, then keepalives and its progress as
    SSE comments (OpenAI clients skip them, curl shows them). Raises a 504 ApiError past
    ``timeout_s`` (the workflow runs on). Closed before the workflow finishes (the client went
    away, so the server closes the stream) or broken, it cancels the workflow: its answer has
    nobody else to go to. Close it explicitly (``contextlib.aclosing``) so that the cancel
    does not wait for garbage collection."""
    finished = False
    try:
        for line in first:
            yield line
        async with asyncio.timeout(timeout_s):
            async for event in with_keepalive(service.follow(workflow_id, tenant)):
                yield KEEPALIVE if event is None else f": {event.kind} {event.sequence}\n\n"
        finished = True
    except TimeoutError:
        finished = True
        raise workflow_timed_out(workflow_id, timeout_s) from None
    finally:
        if not finished:
            _cancel_in_background(service, workflow_id, tenant)


async def _workflow_stream(
    service: WorkflowService,
    metrics: ApiMetrics,
    tenant: str,
    workflow_id: uuid.UUID,
    chunks: _Chunks,
    include_usage: bool,
    timeout_s: float,
) -> AsyncIterator[str]:
    start = {"workflow_id": str(workflow_id), "status": "running"}
    role = chunks.delta({"role": "assistant", "content": ""}, conductor=start)
    progress = workflow_progress(service, workflow_id, tenant, timeout_s, [role])
    try:
        async with contextlib.aclosing(progress):
            async for line in progress:
                yield line
    except ApiError as timed_out:
        yield data_line(error_body(timed_out.status, timed_out.message, code=timed_out.code))
        yield DONE
        return
    view = await asyncio.to_thread(load_workflow, service.engine, workflow_id, tenant)
    if view is not None:
        metrics.workflow(tenant, view)
    if view is None or view.status != "completed":
        error = workflow_failed(view) if view else ApiError(404, "workflow not found")
        yield data_line(error_body(error.status, error.message, code=error.code))
        yield DONE
        return
    yield chunks.delta({"content": view.answer or ""})
    yield chunks.delta({}, finish="stop", conductor=conductor_field(view))
    if include_usage:
        yield chunks.usage(openai_usage(view.usage))
    yield DONE


def worker_messages(messages: list[ChatMessageIn]) -> list[ChatMessage]:
    """The messages as a worker gets them (a developer message is a system message), tool
    calls and results and images included; a 400 names a call, result or image that is not
    whole."""
    out = []
    for i, m in enumerate(messages):
        if m.role == "tool" and m.tool_call_id is None:
            raise ApiError(
                400,
                f"messages[{i}].tool_call_id: a tool result names the call it answers",
                param=f"messages[{i}].tool_call_id",
            )
        out.append(
            ChatMessage(
                role="system" if m.role == "developer" else m.role,
                content=m.text,
                tool_calls=chat_tool_calls(m.tool_calls, f"messages[{i}].tool_calls"),
                tool_call_id=m.tool_call_id if m.role == "tool" else None,
                images=message_images(m, i),
            )
        )
    return out


def check_passthrough(
    service: WorkflowService, caller: Caller, model: str, options: ConductorOptions | None
) -> None:
    """A worker called directly: one this key may call (404 otherwise), with no workflow
    options."""
    if model not in service.allowed_workers(caller):
        raise unknown_model(model)
    if options is not None:
        raise ApiError(
            400,
            f"conductor options apply to variants; {model!r} is a single worker",
            param="conductor",
        )


async def _passthrough(
    service: WorkflowService,
    metrics: ApiMetrics,
    caller: Caller,
    body: ChatCompletionRequest,
    created: int,
    include_usage: bool,
    answer_format: AnswerFormat | None = None,
    tools: ToolUse | None = None,
) -> JSONResponse | StreamingResponse:
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    messages = worker_messages(body.messages)
    sampling = sampling_of(body.max_completion_tokens or body.max_tokens, body.temperature)
    call = worker_call(service, caller, body.model, messages, answer_format, tools, sampling)

    if body.stream:
        chunks = _Chunks(completion_id, body.model, created)
        stream = _passthrough_stream(call, metrics, body.model, chunks, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
    result = await call_worker(call, metrics, body.model)
    usage = openai_usage(result.usage)
    return _completion(
        completion_id,
        body.model,
        created,
        result.text,
        usage,
        passthrough_field(result),
        result.tool_calls,
        finish_reason(result),
    )


# How each vendor says an answer was cut at its token bound.
CUT_SHORT = frozenset({"length", "max_tokens", "MAX_TOKENS"})


def finish_reason(result: StepCallResult) -> str:
    """A direct call's finish_reason as OpenAI's clients read it: calls, cut short, or done."""
    if result.tool_calls:
        return "tool_calls"
    return "length" if result.finish_reason in CUT_SHORT else "stop"


def sampling_of(max_tokens: int | None, temperature: float | None) -> Sampling | None:
    """A direct call's own settings, if the request sets any."""
    if max_tokens is None and temperature is None:
        return None
    return Sampling(max_tokens=max_tokens, temperature=temperature)


def worker_call(
    service: WorkflowService,
    caller: Caller,
    worker: str,
    messages: list[ChatMessage],
    answer_format: AnswerFormat | None,
    tools: ToolUse | None = None,
    sampling: Sampling | None = None,
) -> Call:
    """The call to one worker, made when awaited (inside the stream, if streaming): told the
    answer's form, if one is asked for, and its answer made to conform or failed (an answer
    of tool calls has no text to conform)."""
    if answer_format is not None:
        messages = [*messages, ChatMessage(role="system", content=answer_format.instruction())]

    async def call() -> StepCallResult:
        try:
            result = await service.passthrough(
                worker,
                messages,
                allowed_workers=caller.allowed_pool,
                tenant=caller.tenant,
                tools=tools,
                sampling=sampling,
            )
        except StepCallFailed as exc:
            await _count_spend(service, caller, worker, exc.attempts)
            raise
        await _count_spend(service, caller, worker, result.attempts)
        if answer_format is None or result.tool_calls:
            return result
        try:
            text = answer_format.conform(result.text)
        except AnswerFormatError as exc:
            reason = f"{worker}: the answer does not follow the asked format: {exc}"
            raise StepCallFailed(reason, result.attempts) from None
        return result.model_copy(update={"text": text})

    return call


async def _count_spend(
    service: WorkflowService, caller: Caller, worker: str, attempts: list[AttemptRecord]
) -> None:
    """What a direct call spent (every attempt), counted against its key's tokens per minute
    and budget as a workflow's spend is."""
    usage, cost = attempts_total(attempts)
    if caller.key_id is None or not (usage.total_tokens or cost):
        return
    try:
        await asyncio.to_thread(
            record_direct_call, service.engine, caller.key_id, worker, usage.total_tokens, cost
        )
    except SQLAlchemyError as exc:  # the answer is paid for: it goes out, uncounted
        logger.warning("could not count a direct call of %s against its key: %s", worker, exc)


def passthrough_field(result: StepCallResult) -> dict[str, Any]:
    return {"worker": result.worker, "cost_usd": result.cost_usd, "attempts": len(result.attempts)}


Call = Callable[[], Awaitable[StepCallResult]]


async def call_worker(call: Call, metrics: ApiMetrics, worker: str) -> StepCallResult:
    try:
        result = await call()
    except StepCallFailed as exc:
        metrics.passthrough.labels(worker, "failed").inc()
        # The gateway retried already (and fell back where the pool says so).
        reason = without_addresses(str(exc))
        named = reason.startswith((worker, f"worker {worker!r}"))
        message = reason if named else f"{worker}: {reason}"
        raise ApiError(502, message, code="worker_failed", retry=False) from None
    metrics.passthrough.labels(worker, "ok").inc()
    return result


async def _passthrough_stream(
    call: Call, metrics: ApiMetrics, worker: str, chunks: _Chunks, include_usage: bool
) -> AsyncIterator[str]:
    yield chunks.delta({"role": "assistant", "content": ""})
    try:
        result = await call_worker(call, metrics, worker)
    except ApiError as error:
        yield data_line(error_body(error.status, error.message, code=error.code))
        yield DONE
        return
    if result.text:
        yield chunks.delta({"content": result.text})
    if result.tool_calls:
        calls = chat_tool_calls_out(result.tool_calls)
        yield chunks.delta({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
    yield chunks.delta({}, finish=finish_reason(result), conductor=passthrough_field(result))
    if include_usage:
        yield chunks.usage(openai_usage(result.usage))
    yield DONE


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, caller: CallerDep) -> ModelList:
    """The variants, then the workers this key may call directly."""
    return ModelList(data=_cards(request.app.state.service, caller))


@router.get("/v1/models/{model}", response_model=ModelCard)
async def get_model(model: str, request: Request, caller: CallerDep) -> ModelCard:
    for card in _cards(request.app.state.service, caller):
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
