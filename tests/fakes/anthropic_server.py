"""A fake Anthropic Messages API server that speaks the documented wire format.

Bodies follow https://docs.anthropic.com/en/api/messages (``message`` object: id, type, role,
model, content blocks, stop_reason, stop_sequence, usage with ``cache_creation_input_tokens`` and
``cache_read_input_tokens``); streams follow /en/api/messages-streaming (message_start,
content_block_start, ping, content_block_delta, content_block_stop, message_delta, message_stop,
error); errors use /en/api/errors ``{"type": "error", "error": {"type", "message"}}``.

The default answer checks what the real API checks and an adapter could get wrong (headers,
required fields, turns that alternate starting with the user, temperature within 0..1), so a
test against the fake fails where the vendor would refuse the request.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from typing import Any

from fakes.http_server import RecordedRequest, ScriptedResponse, ScriptedServer
from fakes.openai_server import count_tokens

MESSAGES_PATH = "/v1/messages"

_ids = itertools.count(1)


def message_body(
    text: str,
    *,
    model: str = "claude-fake",
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_creation_input_tokens: int | None = 0,
    cache_read_input_tokens: int | None = 0,
    stop_reason: str | None = "end_turn",
    thinking: str | None = None,
) -> dict[str, Any]:
    """A ``message`` object as the API returns it; ``thinking`` adds a thinking block first."""
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": "c2lnbmF0dXJl"})
    content.append({"type": "text", "text": text})
    return {
        "id": f"msg_fake{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": cache_creation_input_tokens,
            "cache_read_input_tokens": cache_read_input_tokens,
            "output_tokens": output_tokens,
        },
    }


def error_body(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


def message(text: str, *, delay_s: float = 0.0, **fields: Any) -> ScriptedResponse:
    """A scripted 200; ``fields`` go to ``message_body`` (tokens, model, stop_reason)."""
    return ScriptedResponse(json=message_body(text, **fields), delay_s=delay_s)


def error(
    status: int, type_: str, message: str, headers: Mapping[str, str] | None = None
) -> ScriptedResponse:
    """A scripted error response carrying the Anthropic error object."""
    return ScriptedResponse(
        status=status, json=error_body(type_, message), headers=dict(headers or {})
    )


def sse(name: str, data: Mapping[str, Any]) -> str:
    """One event as the API frames it: a named event line, then its JSON data."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def error_event(type_: str, message: str) -> str:
    """An ``error`` event, as sent when a failure (e.g. overload) happens after the 200."""
    return sse("error", error_body(type_, message))


def stream_events(
    text: str,
    *,
    model: str = "claude-fake",
    input_tokens: int = 10,
    output_tokens: int | None = None,
    cache_creation_input_tokens: int = 0,
    cache_read_input_tokens: int = 0,
    stop_reason: str = "end_turn",
    thinking: str | None = None,
    pieces: int = 3,
    with_stop: bool = True,
) -> list[str]:
    """The events of one streamed message: message_start, ping, (a thinking block,) the text
    block in ``pieces`` deltas, message_delta with the cumulative output count, message_stop."""
    start_usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "cache_read_input_tokens": cache_read_input_tokens,
        "output_tokens": 1,
    }
    start = message_body("", model=model, stop_reason=None) | {"content": [], "usage": start_usage}
    events = [sse("message_start", {"type": "message_start", "message": start})]
    events.append(sse("ping", {"type": "ping"}))
    index = 0
    if thinking is not None:
        events += _block(index, {"type": "thinking", "thinking": ""}, "thinking_delta", [thinking])
        index += 1
    size = max(1, math.ceil(len(text) / pieces))
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    events += _block(index, {"type": "text", "text": ""}, "text_delta", chunks)
    output = len(text.split()) if output_tokens is None else output_tokens
    delta = {"stop_reason": stop_reason, "stop_sequence": None}
    events.append(
        sse(
            "message_delta",
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": output}},
        )
    )
    if with_stop:
        events.append(sse("message_stop", {"type": "message_stop"}))
    return events


def _block(index: int, opening: dict[str, Any], delta_type: str, chunks: list[str]) -> list[str]:
    field = "text" if delta_type == "text_delta" else "thinking"
    events = [
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
    ]
    events += [
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": delta_type, field: c},
            },
        )
        for c in chunks
    ]
    events.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def streamed(text: str, *, cut_after: int | None = None, **fields: Any) -> ScriptedResponse:
    """A scripted 200 event stream; ``cut_after`` drops the connection after that many events."""
    return ScriptedResponse(events=stream_events(text, **fields), cut_after=cut_after)


def content_text(content: Any) -> str:
    """A message's text: the API takes a string or a list of content blocks."""
    if isinstance(content, list):
        return "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return str(content)


class FakeAnthropicServer(ScriptedServer):
    """Answers ``POST /v1/messages`` with ``"echo: <last user text>"`` unless a script is queued.

    Usage in the default answer counts about four characters a token plus four per message
    (the system prompt included), like the OpenAI fake; ``latency_s`` delays every default
    answer; ``stream: true`` requests get an event stream.
    """

    def __init__(self, latency_s: float = 0.0) -> None:
        super().__init__()
        self.latency_s = latency_s

    @property
    def base_url(self) -> str:
        return self.url  # the adapter appends /v1/messages, as the Anthropic SDKs do

    @property
    def message_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path == MESSAGES_PATH]

    def default_response(self, request: RecordedRequest) -> ScriptedResponse:
        if request.path != MESSAGES_PATH:
            return error(404, "not_found_error", f"Not found: {request.path}")
        if request.method != "POST":
            return error(405, "invalid_request_error", f"Method {request.method} not allowed")
        if not request.headers.get("x-api-key"):
            return error(401, "authentication_error", "x-api-key header is required")
        if not request.headers.get("anthropic-version"):
            return error(400, "invalid_request_error", "anthropic-version: header is required")
        body = request.json
        problem = _check_body(body)
        if problem is not None:
            return error(400, "invalid_request_error", problem)
        messages: list[dict[str, Any]] = body["messages"]
        last_user = next(m for m in reversed(messages) if m["role"] == "user")
        text = f"echo: {content_text(last_user.get('content'))}"
        texts = [content_text(m.get("content")) for m in messages]
        if isinstance(body.get("system"), str):
            texts.append(body["system"])
        input_tokens = sum(count_tokens(t) + 4 for t in texts)
        output_tokens = count_tokens(text)
        model = body["model"]
        if body.get("stream") is True:
            events = stream_events(
                text, model=model, input_tokens=input_tokens, output_tokens=output_tokens
            )
            return ScriptedResponse(events=events, delay_s=self.latency_s)
        return message(
            text,
            model=model,
            delay_s=self.latency_s,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )


def _check_body(body: Any) -> str | None:
    """What the API would refuse in this body (its own wording, roughly), or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str):
        return "model: Field required"
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Field required (an integer >= 1)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: Field required (a non-empty list)"
    for number, item in enumerate(messages):
        role = item.get("role") if isinstance(item, dict) else None
        if role not in ("user", "assistant"):
            return f"messages.{number}.role: Input should be 'user' or 'assistant', got {role!r}"
        if number == 0 and role != "user":
            return "messages: first message must use the 'user' role"
        if number and role == messages[number - 1]["role"]:
            return f"messages: roles must alternate, but found two {role!r} turns in a row"
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 1:
        return "temperature: range: 0..1"
    return None
