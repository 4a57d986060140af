"""The ``response`` object of the Responses API, as the routes and the streamed events send it:
the fields of ``openai.types.responses.Response``, with the extra ``conductor`` field. A
workflow's output starts with a reasoning item that summarises its progress (its plans and
steps, ``progress_summary``), then its answer: a message, or function calls."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from conductor.chat import Usage
from conductor_adapters.store.responses import StoredResponse
from conductor_api.openai_shared import conductor_field, openai_usage, workflow_failed
from conductor_api.progress_summary import workflow_facts
from conductor_api.schemas import UsageView, WorkflowView
from conductor_api.tools import namespaces_of, split_namespaced

# A workflow's status, as a response's.
STATUS = {
    "queued": "queued",
    "running": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
RESPONSE_ID_PREFIX = "resp_"


def response_id(value: uuid.UUID) -> str:
    return f"{RESPONSE_ID_PREFIX}{value.hex}"


def parse_response_id(value: str) -> uuid.UUID | None:
    """The id in ``resp_<32 hex digits>``; None for anything else."""
    if not value.startswith(RESPONSE_ID_PREFIX) or len(value) != len(RESPONSE_ID_PREFIX) + 32:
        return None
    try:
        return uuid.UUID(hex=value.removeprefix(RESPONSE_ID_PREFIX))
    except ValueError:
        return None


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


def output_item_id(stored: StoredResponse) -> str:
    """The id of the response's one output item: derived from the response's, so that every
    event and every read names the same item."""
    return f"msg_{stored.id.hex}"


def output_item(stored: StoredResponse, text: str, status: str) -> dict[str, Any]:
    """The response's one output item: the answer as an assistant message (empty while in
    progress)."""
    return {
        "id": output_item_id(stored),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if status == "in_progress" else [text_part(text)],
    }


def reasoning_item_id(stored: StoredResponse) -> str:
    return f"rs_{stored.id.hex}"


def reasoning_item(stored: StoredResponse, summary: list[str], status: str) -> dict[str, Any]:
    """A workflow's progress as a reasoning item (``progress_summary``): one ``summary_text``
    part per fact; no reasoning text and no encrypted content (there is nothing to carry to
    a later turn: a reasoning item sent back as input is ignored)."""
    return {
        "id": reasoning_item_id(stored),
        "type": "reasoning",
        "summary": [summary_part(text) for text in summary],
        "encrypted_content": None,
        "status": status,
    }


def summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def function_call_item(
    stored: StoredResponse, index: int, call: dict[str, Any], status: str
) -> dict[str, Any]:
    """A function call the worker asked for (``call``: a ToolCall's fields), as an output item;
    its id is derived from the response's, like the message's. A function of a namespace tool
    is named as the client named it, with its ``namespace``."""
    namespace, name = split_namespaced(call["name"], namespaces_of(stored.settings.get("tools")))
    item = {
        "id": f"fc_{stored.id.hex}_{index}",
        "type": "function_call",
        "call_id": call["id"],
        "name": name,
        "arguments": call["arguments"] if status == "completed" else "",
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def output_items(
    stored: StoredResponse, text: str, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The answer's output items: its text as a message (unless it is calls alone), then each
    function call."""
    items = [] if calls and not text else [output_item(stored, text, "completed")]
    return items + [function_call_item(stored, i, c, "completed") for i, c in enumerate(calls)]


def text_part(text: str) -> dict[str, Any]:
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
    tool_calls: list[dict[str, Any]] | None = None,
    incomplete: str | None = None,
    reasoning: list[str] | None = None,
) -> dict[str, Any]:
    """The response as it stands. The settings Conductor takes but does not act on are echoed
    as sent; those it refuses have their one accepted value. A workflow's progress so far
    (``reasoning``: its facts) comes first, as a reasoning item, once there is any."""
    settings = stored.settings
    output = [] if text is None else output_items(stored, text, tool_calls or [])
    if reasoning:
        done = status in ("completed", "failed", "cancelled", "incomplete")
        output.insert(0, reasoning_item(stored, reasoning, "completed" if done else "in_progress"))
    return {
        "id": response_id(stored.id),
        "object": "response",
        "created_at": int(stored.created_at.timestamp()),
        "completed_at": int(completed_at.timestamp()) if completed_at else None,
        "status": status,
        "model": stored.model,
        "output": output,
        "usage": usage,
        "error": None if error is None else {"code": "server_error", "message": error},
        "incomplete_details": None if incomplete is None else {"reason": incomplete},
        "instructions": stored.instructions,
        "previous_response_id": stored.previous_response_id,
        "metadata": stored.labels,
        "store": stored.store,
        "max_output_tokens": settings.get("max_output_tokens"),
        "max_tool_calls": settings.get("max_tool_calls"),
        "top_logprobs": settings.get("top_logprobs"),
        "temperature": settings.get("temperature"),
        "top_p": settings.get("top_p"),
        "parallel_tool_calls": settings.get("parallel_tool_calls", True),
        "tool_choice": settings.get("tool_choice", "auto"),
        "tools": settings.get("tools", []),
        "truncation": "disabled",
        "text": {"format": _text_format(settings.get("text")), "verbosity": "medium"},
        "reasoning": {"effort": None, "summary": None},
        "background": False,
        "service_tier": settings.get("service_tier", "default"),
        "user": settings.get("user"),
        "safety_identifier": settings.get("safety_identifier"),
        "prompt_cache_key": settings.get("prompt_cache_key"),
        "conductor": conductor,
    }


def _text_format(text: Any) -> dict[str, Any]:
    """``text.format`` as the request asked for it (structured output: json_object, or
    json_schema with its name and schema), plain text when it asked for none."""
    form = text.get("format") if isinstance(text, dict) else None
    return form if isinstance(form, dict) else {"type": "text"}


def workflow_object(stored: StoredResponse, view: WorkflowView) -> dict[str, Any]:
    """A workflow's response: its progress (a reasoning item) and, once completed, its answer;
    the reason once failed or cancelled."""
    completed = view.status == "completed"
    return response_object(
        stored,
        status=STATUS[view.status],
        text=view.answer or "" if completed else None,
        usage=responses_usage(view.usage),
        conductor=conductor_field(view),
        error=workflow_failed(view).message if view.status in ("failed", "cancelled") else None,
        completed_at=view.finished_at if completed else None,
        tool_calls=[call.model_dump() for call in view.tool_calls],
        reasoning=workflow_facts(view),
    )


def passthrough_object(stored: StoredResponse) -> dict[str, Any]:
    """A worker call's response, from what was kept of its answer."""
    output = stored.output or {}
    cut = output.get("finish_reason") == "length"  # at max_output_tokens
    return response_object(
        stored,
        status="incomplete" if cut else "completed",
        incomplete="max_output_tokens" if cut else None,
        text=output.get("text", ""),
        usage=output.get("usage"),
        conductor=output.get("conductor", {}),
        completed_at=stored.created_at,
        tool_calls=output.get("tool_calls") or [],
    )
