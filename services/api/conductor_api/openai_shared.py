"""What the OpenAI-compatible doors (Chat Completions, Responses, completions) share in
reading a request and writing an answer: the question a conversation makes, the messages a
worker gets, where tools may go, the answer's form and sampling, usage and the ``conductor``
field, and the errors for an unknown model and a workflow that failed or ran out of time."""

from __future__ import annotations

import uuid
from typing import Any

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Sampling, ToolUse, Usage
from conductor.ports import StepCallResult
from conductor_adapters.store.redact import without_addresses
from conductor_api.errors import ApiError, unknown_model
from conductor_api.images import message_images
from conductor_api.rules import Caller
from conductor_api.schemas import ChatMessageIn, ConductorOptions, UsageView, WorkflowView
from conductor_api.service import WorkflowService
from conductor_api.tools import (
    chat_tool_calls,
    describe_calls,
    refuse_for_worker,
    takes_tools,
)


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


def check_tools(
    service: WorkflowService,
    worker: str | None,
    tools: ToolUse | None,
    messages: list[ChatMessageIn],
    messages_param: str | None = None,
) -> None:
    """Tools, tool calls and tool results where they have a meaning: on a direct call to a
    worker whose wire format carries them, or on a workflow (whose rules check that its pool
    has such a worker for the answering step; calls and results are its conversation); a 400
    naming the field otherwise (a message by its index, or ``messages_param`` when given)."""
    if worker is None:
        return
    spec = service.pool.get(worker)
    if takes_tools(spec):
        return
    if tools is not None:
        raise refuse_for_worker(spec, "tools")
    for i, message in enumerate(messages):
        if message.role == "tool" or message.tool_calls:
            raise refuse_for_worker(spec, messages_param or f"messages[{i}]")


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


def workflow_answer_format(
    answer_format: AnswerFormat | None, messages: list[ChatMessageIn]
) -> AnswerFormat | None:
    """A workflow's answer format: a json_object one carries the client's system and developer
    text, which says what the object holds (a worker called directly reads them anyway)."""
    if answer_format is None or answer_format.type != "json_object":
        return answer_format
    said = [m.text for m in messages if m.role in ("system", "developer") and m.text]
    return answer_format.model_copy(update={"instructions": "\n\n".join(said) or None})


def sampling_of(max_tokens: int | None, temperature: float | None) -> Sampling | None:
    """A direct call's own settings, if the request sets any."""
    if max_tokens is None and temperature is None:
        return None
    return Sampling(max_tokens=max_tokens, temperature=temperature)


# How each vendor says an answer was cut at its token bound.
CUT_SHORT = frozenset({"length", "max_tokens", "MAX_TOKENS"})


def finish_reason(result: StepCallResult) -> str:
    """A direct call's finish_reason as OpenAI's clients read it: calls, cut short, or done."""
    if result.tool_calls:
        return "tool_calls"
    return "length" if result.finish_reason in CUT_SHORT else "stop"


def passthrough_field(result: StepCallResult) -> dict[str, Any]:
    return {"worker": result.worker, "cost_usd": result.cost_usd, "attempts": len(result.attempts)}


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


def workflow_timed_out(workflow_id: uuid.UUID, timeout_s: float) -> ApiError:
    message = f"workflow {workflow_id} did not finish within {timeout_s:g} s"
    return ApiError(504, message, code="timeout", retry=False)


def workflow_failed(view: WorkflowView) -> ApiError:
    reason = without_addresses(view.error or "no answer")
    message = f"workflow {view.id} failed: {reason}"
    return ApiError(502, message, code="workflow_failed", retry=False)
