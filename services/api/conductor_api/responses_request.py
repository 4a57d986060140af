"""What a ``/v1/responses`` request asks for: the fields Conductor cannot honour (refused with a
400 naming them), the input items as stored, and the question the Conductor gets.

A field is refused unless it carries a value that asks for nothing (the SDKs send ``tools: []``,
``truncation: "disabled"``, ``include: []`` and the like by default); a field the API does not
know is refused too, as the OpenAI API does.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, cast

from conductor.answer_format import AnswerFormat
from conductor.orchestration import MAX_QUESTION_CHARS, text_fault
from conductor_adapters.store.responses import StoredResponse
from conductor_api.errors import ApiError, invalid, unknown_fields, unsupported
from conductor_api.images import IMAGE_PART, image_part
from conductor_api.openai_shared import render_question
from conductor_api.request_policy import RESPONSES, blank, refuse_unsupported
from conductor_api.responses_schemas import ResponseCreateRequest
from conductor_api.schemas import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_MESSAGES,
    ChatMessageIn,
    ContentPart,
)
from conductor_api.tools import namespaced, tool_call

ROLES = ("user", "system", "developer", "assistant")
Role = Literal["user", "system", "developer", "assistant", "tool"]
TEXT_PARTS = ("input_text", "output_text")
# What may be asked for with include: Codex CLI asks for its reasoning items' encrypted content
# with every request. A workflow's reasoning item is a summary of its progress with nothing
# encrypted to carry to a later turn (its encrypted_content stays null), so nothing is added.
INCLUDABLE = ("reasoning.encrypted_content",)
REASONING = {
    "effort": (None, "none", "minimal", "low", "medium", "high", "xhigh"),
    "summary": (None, "auto", "concise", "detailed", "none"),
    "generate_summary": (None, "auto", "concise", "detailed", "none"),
}


def text_answer_format(text: Any) -> AnswerFormat | None:
    """The answer's form ``text.format`` asks for: plain text (None), one JSON object, or one
    that matches ``schema`` (the Responses API's structured output, which the Agents SDK's
    ``output_type`` sends)."""
    form = text.get("format") if isinstance(text, dict) else None
    if form is None or form == {"type": "text"}:
        return None
    kind = form.get("type") if isinstance(form, dict) else form
    if kind == "json_object":
        return AnswerFormat(type="json_object")
    if kind == "json_schema" and isinstance(form.get("schema"), dict):
        name = str(form.get("name") or "")[:64] or None
        answer_format = AnswerFormat(type="json_schema", name=name, json_schema=form["schema"])
        answer_format.check_schema("text.format.schema")
        return answer_format
    raise unsupported(
        "text.format",
        f"{kind!r} output is not supported: text, json_object, or json_schema with a schema",
    )


def check_supported(body: ResponseCreateRequest) -> None:
    """Refuse, with a 400 naming it, every field Conductor cannot honour unless it carries a
    value that asks for nothing (``request_policy.RESPONSES``), and what ``include``, ``text``
    and ``reasoning`` hold that it does not know or cannot honour. (A field the API does not
    know is refused by the request model.)"""
    refuse_unsupported(body, RESPONSES)
    for value in body.include or []:
        if value not in INCLUDABLE:
            raise unsupported(
                "include",
                f"{value!r} cannot be included: a response holds its text, its usage and "
                "a summary of its workflow's progress only; send [] or "
                '["reasoning.encrypted_content"] (the summary has no encrypted content)',
            )
    check_text(body.text)
    check_reasoning(body.reasoning)


def check_reasoning(reasoning: Any) -> None:
    """Reasoning settings are accepted and have no effect (each worker runs with the pool
    file's settings; a workflow's response summarises its progress in a reasoning item
    whatever they say); what they hold must still be reasoning settings."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise invalid("reasoning", "expected an object with effort and summary")
    for key, value in reasoning.items():
        if key not in REASONING:
            raise unknown_fields([f"reasoning.{key}"])
        if value not in REASONING[key]:
            allowed = ", ".join(str(v) for v in REASONING[key] if v is not None)
            raise invalid(f"reasoning.{key}", f"expected one of {allowed} or null")


def check_text(text: Any) -> None:
    if blank(text):
        return
    if not isinstance(text, dict):
        raise unsupported("text", 'expected {"format": {...}}')
    for key, value in text.items():
        if key == "format":
            text_answer_format(text)  # refuses a format it cannot honour
        elif key == "verbosity":
            if value not in (None, "medium"):
                raise unsupported("text.verbosity", "verbosity cannot be set on a workflow")
        else:
            raise unknown_fields([f"text.{key}"])


def labels_of(body: ResponseCreateRequest) -> dict[str, str]:
    """The response's labels: its ``metadata``, and its ``client_metadata`` kept beside them
    (Codex CLI's session ids; ``metadata`` wins a name both hold), each value cut to a label's
    length."""
    labels = {k: v[:MAX_LABEL_VALUE_CHARS] for k, v in (body.client_metadata or {}).items()}
    labels.update(body.metadata or {})
    if len(labels) > MAX_LABELS:
        raise invalid("client_metadata", f"with metadata, at most {MAX_LABELS} labels in all")
    return labels


def checked_text(text: str, param: str) -> str:
    """Text a client sent that becomes part of a question: within the question's limit, and
    without what no store or provider takes (``text_fault``: NUL, lone surrogates)."""
    if len(text) > MAX_QUESTION_CHARS:
        raise invalid(param, f"longer than {MAX_QUESTION_CHARS} characters")
    fault = text_fault(text)
    if fault is not None:
        raise invalid(param, f"must not contain {fault}")
    return text


def _part_text(part: Any, param: str) -> str:
    if not isinstance(part, dict):
        raise invalid(param, "expected a content part object")
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid(f"{param}.text", "expected a string")
        return checked_text(text, f"{param}.text")
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return checked_text(part["refusal"], f"{param}.refusal")
    if isinstance(kind, str) and kind:
        raise unsupported(
            param,
            f"{kind} parts are not supported: text parts, and images (input_image) for a "
            "worker called directly",
        )
    raise invalid(f"{param}.type", 'expected "input_text" or "output_text"')


def _item(item: Any, index: int) -> dict[str, Any] | None:
    """One input item as stored: a message with an id and text parts, a function call, or a
    function call's output; None for a reasoning item, which is not kept."""
    param = f"input.{index}"
    if not isinstance(item, dict):
        raise invalid(param, "expected an input item object")
    kind = item.get("type", "message")
    if kind == "reasoning":
        # An earlier response's output sent back as it came (the Agents SDK and Codex CLI do):
        # a workflow's progress, or another model's reasoning, which no worker here could read.
        return None
    if kind == "item_reference":
        raise unsupported(
            param, "item references are not supported; send the message or previous_response_id"
        )
    if kind == "function_call":
        return _function_call(item, param)
    if kind == "function_call_output":
        return _function_call_output(item, param)
    if kind != "message":
        raise unsupported(
            f"{param}.type",
            f"{kind!r} items are not supported: messages, function calls and their outputs "
            "(reasoning items are accepted and ignored; no built-in tools)",
        )
    return _message(item, param)


def _function_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    call = tool_call(item.get("call_id"), item.get("name"), item.get("arguments"), param)
    checked_text(call.arguments, f"{param}.arguments")
    ident, namespace = item.get("id"), item.get("namespace")
    stored = {
        "id": ident if isinstance(ident, str) and ident else f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }
    if namespace is not None:  # a call of a namespace tool's function
        if not isinstance(namespace, str) or not namespace:
            raise invalid(f"{param}.namespace", "expected the name of the call's namespace")
        stored["namespace"] = namespace
    return stored


def _function_call_output(item: dict[str, Any], param: str) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{param}.call_id", "a function call's output names the call it answers")
    if isinstance(output, list):  # parts, as newer SDKs may send them
        output = "".join(_part_text(p, f"{param}.output.{i}") for i, p in enumerate(output))
    if not isinstance(output, str):
        raise invalid(f"{param}.output", "expected a string or a list of text parts")
    return {
        "id": f"fco_{uuid.uuid4().hex}",
        "type": "function_call_output",
        "call_id": call_id,
        "output": checked_text(output, f"{param}.output"),
        "status": "completed",
    }


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise invalid(f"{param}.role", f"expected one of {', '.join(ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        parts = [_stored_part(role, checked_text(content, f"{param}.content"))]
    elif isinstance(content, list) and content:
        if len(content) > MAX_MESSAGES:
            raise invalid(f"{param}.content", f"at most {MAX_MESSAGES} parts")
        parts = [_part(role, p, f"{param}.content.{i}") for i, p in enumerate(content)]
    else:
        raise invalid(f"{param}.content", "expected a string or a list of text parts")
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": role,
        "status": "completed",
        "content": parts,
    }


def _part(role: str, part: Any, param: str) -> dict[str, Any]:
    """A content part as stored: text, or (in a user message) an image by its URL."""
    if not (isinstance(part, dict) and part.get("type") == "input_image"):
        return _stored_part(role, _part_text(part, param))
    if role != "user":
        raise unsupported(param, "images go in user messages")
    if part.get("file_id") is not None:
        raise unsupported(f"{param}.file_id", "files are not kept here: send the image_url")
    image = image_part({"url": part.get("image_url"), "detail": part.get("detail")}, param)
    return {"type": "input_image", "image_url": image.url, "detail": image.detail or "auto"}


def _stored_part(role: str, text: str) -> dict[str, Any]:
    """A part as the input items list gives it back: an assistant's message is an output
    message there (``ResponseOutputMessage``), whose text parts carry their annotations."""
    if role == "assistant":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": "input_text", "text": text}


def first_image(items: list[dict[str, Any]]) -> str | None:
    """Where the first image of the input is (``input.I.content.J``); None without one."""
    for i, item in enumerate(items):
        for j, part in enumerate(item.get("content") or []):
            if isinstance(part, dict) and part.get("type") == "input_image":
                return f"input.{i}.content.{j}"
    return None


def input_items(raw: Any) -> list[dict[str, Any]]:
    """The request's input as stored messages (reasoning items left out); a 400 naming the
    item and part at fault."""
    if isinstance(raw, str):
        return [_message({"role": "user", "content": raw}, "input.0")]
    if not isinstance(raw, list) or not raw:
        raise invalid("input", "expected a string or a non-empty list of input items")
    if len(raw) > MAX_MESSAGES:
        raise invalid("input", f"at most {MAX_MESSAGES} items, not {len(raw)}")
    items = [_item(item, i) for i, item in enumerate(raw)]
    return [item for item in items if item is not None]


def turns(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored input items as chat turns: a message's role and text; function calls joined to
    the assistant turn they follow (calls made together are one turn); an output as a tool
    turn naming its call."""
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            name = item["name"]
            if item.get("namespace"):
                name = namespaced(item["namespace"], name)
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": name, "arguments": item["arguments"]},
            }
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]})
        else:
            parts = item.get("content", [])
            text = "".join(str(p.get("text", "")) for p in parts)
            turn: dict[str, Any] = {"role": item["role"], "content": text}
            images = [
                {"url": p["image_url"], "detail": p.get("detail")}
                for p in parts
                if p.get("type") == "input_image"
            ]
            if images:
                turn["images"] = images
            out.append(turn)
    return out


def conversation(stored: StoredResponse) -> list[ChatMessageIn]:
    """Instructions, the earlier conversation, then this input, as chat messages."""
    messages: list[dict[str, Any]] = []
    if stored.instructions:
        messages.append({"role": "system", "content": stored.instructions})
    messages += stored.history + turns(stored.input_items)
    # Built without validation: an earlier answer may be longer than one message may be; the
    # question as a whole is checked when the workflow is submitted.
    return [
        ChatMessageIn.model_construct(
            role=cast(Role, m["role"]),
            content=_chat_content(m),
            tool_calls=m.get("tool_calls"),
            tool_call_id=m.get("tool_call_id"),
        )
        for m in messages
    ]


def _chat_content(turn: dict[str, Any]) -> str | list[ContentPart]:
    """A turn's content as a chat message holds it: its text, then its images as
    ``image_url`` parts."""
    if not turn.get("images"):
        return str(turn["content"])
    text = ContentPart.model_construct(type="text", text=turn["content"])
    images = [ContentPart.model_construct(type=IMAGE_PART, image_url=i) for i in turn["images"]]
    return [text, *images]


def question(messages: list[ChatMessageIn]) -> str:
    """The question the Conductor gets, as chat completions render it; a 400 naming the input
    where chat completions would name the messages."""
    try:
        return render_question(messages)
    except ApiError as error:
        if error.param != "messages":
            raise
        raise invalid("input", "include at least one user message") from None
