"""A fake Anthropic Messages API server that speaks the documented wire format.

Bodies follow https://docs.anthropic.com/en/api/messages (``message`` object: id, type, role,
model, content blocks, stop_reason, stop_sequence, usage with ``cache_creation_input_tokens`` and
``cache_read_input_tokens``); streams follow /en/api/messages-streaming (message_start,
content_block_start, ping, content_block_delta, content_block_stop, message_delta, message_stop,
error); errors use /en/api/errors ``{"type": "error", "error": {"type", "message"}}``; tools,
``tool_choice``, ``tool_use`` and ``tool_result`` blocks follow /en/docs/agents-and-tools/tool-use;
``image`` blocks follow /en/docs/build-with-claude/vision; JSON outputs (``output_config.format``)
follow /en/docs/build-with-claude/structured-outputs.

The default answer checks what the real API checks and an adapter could get wrong (headers,
required fields, turns that alternate starting with the user, temperature within 0..1, tool
definitions and choice, each turn of calls answered by results that open the next user turn,
image sources of a known type and media type, an output format's schema with every object
closed and no constraint the API cannot enforce), so a test against the fake fails where the
vendor would refuse the request.
"""

from __future__ import annotations

import binascii
import itertools
import json
import math
from base64 import b64decode
from collections.abc import Mapping, Sequence
from typing import Any

from fakes.http_server import RecordedRequest, ScriptedResponse, ScriptedServer
from fakes.json_answer import PROSE, schema_instance
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


def tool_use_block(ident: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A call the model asks for, as a ``tool_use`` content block."""
    return {"type": "tool_use", "id": ident, "name": name, "input": dict(arguments)}


def tool_use_body(
    blocks: Sequence[Mapping[str, Any]], *, text: str | None = None, **fields: Any
) -> dict[str, Any]:
    """A ``message`` that asks for calls: ``text`` (if any) first, then the tool_use ``blocks``,
    ``stop_reason`` "tool_use"; ``fields`` go to ``message_body``."""
    body = message_body(text or "", stop_reason="tool_use", **fields)
    body["content"] = [*(body["content"] if text else []), *map(dict, blocks)]
    return body


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
    """A message's text: the API takes a string or a list of content blocks (a tool result's
    text counts: it is what the model reads of it)."""
    if isinstance(content, list):
        return "".join(
            str(b.get("text", "")) if b.get("type") == "text" else content_text(b["content"])
            for b in content
            if isinstance(b, dict) and (b.get("type") == "text" or "content" in b)
        )
    return str(content)


class FakeAnthropicServer(ScriptedServer):
    """Answers ``POST /v1/messages`` with ``"echo: <last user text>"`` unless a script is queued.

    Usage in the default answer counts about four characters a token plus four per message
    (the system prompt included), like the OpenAI fake; ``latency_s`` delays every default
    answer; ``stream: true`` requests get an event stream. A request with
    ``output_config.format`` is answered with JSON that follows its schema; with
    ``prose_unless_asked_natively`` set (a model that ignores JSON instructions in the prompt),
    any other request is answered with prose.
    """

    def __init__(self, latency_s: float = 0.0) -> None:
        super().__init__()
        self.latency_s = latency_s
        self.prose_unless_asked_natively = False

    def reset(self) -> None:
        super().reset()
        self.prose_unless_asked_natively = False

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
        output_format = (body.get("output_config") or {}).get("format")
        if output_format is not None:
            text = json.dumps(schema_instance(output_format["schema"]))
        elif self.prose_unless_asked_natively:
            text = PROSE
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
    return (
        _check_tools(body)
        or _check_blocks(messages, tools="tools" in body)
        or _check_output_config(body)
    )


def _check_output_config(body: dict[str, Any]) -> str | None:
    """``output_config.format``: a json_schema format whose schema the API can enforce, and no
    prefilled answer (the structured-outputs docs: incompatible with JSON outputs)."""
    config = body.get("output_config")
    if config is None:
        return None
    if not isinstance(config, dict):
        return "output_config: Input should be a valid dictionary"
    for extra in sorted(set(config) - {"format", "effort"}):
        return f"output_config.{extra}: Extra inputs are not permitted"
    output_format = config.get("format")
    if output_format is None:
        return None
    if not isinstance(output_format, dict) or output_format.get("type") != "json_schema":
        return "output_config.format.type: Input should be 'json_schema'"
    for extra in sorted(set(output_format) - {"type", "schema"}):
        return f"output_config.format.{extra}: Extra inputs are not permitted"
    if not isinstance(output_format.get("schema"), dict):
        return "output_config.format.schema: Field required"
    if body["messages"][-1]["role"] == "assistant":
        return "Prefilling the assistant's answer is not supported with structured outputs"
    return _check_schema(output_format["schema"], "output_config.format.schema")


# Keywords the docs list as not supported ("JSON Schema limitations"); minItems only 0 or 1.
_UNSUPPORTED_KEYWORDS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "maxItems",
)


def _check_schema(schema: Any, where: str) -> str | None:
    """Objects must set ``additionalProperties: false``; constraints it cannot enforce are
    refused (subschemas under properties, $defs, items and the *Of lists are checked too)."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    if (is_object or "properties" in schema) and schema.get("additionalProperties") is not False:
        return f"{where}: For 'object' type, 'additionalProperties' must be explicitly set to false"
    for keyword in _UNSUPPORTED_KEYWORDS:
        if keyword in schema:
            return f"{where}: '{keyword}' is not supported"
    if schema.get("minItems", 0) not in (0, 1):
        return f"{where}: 'minItems' values other than 0 or 1 are not supported"
    subschemas: list[tuple[str, Any]] = [("items", schema.get("items"))]
    for key in ("properties", "$defs", "definitions"):
        subschemas += [(f"{key}.{name}", sub) for name, sub in (schema.get(key) or {}).items()]
    for key in ("anyOf", "allOf", "oneOf"):
        subschemas += [(f"{key}.{n}", sub) for n, sub in enumerate(schema.get(key) or [])]
    for path, sub in subschemas:
        problem = _check_schema(sub, f"{where}.{path}")
        if problem is not None:
            return problem
    return None


_TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema", "cache_control"})
# The fields each tool_choice type takes besides its type.
_CHOICE_FIELDS = {
    "auto": {"disable_parallel_tool_use"},
    "any": {"disable_parallel_tool_use"},
    "tool": {"name", "disable_parallel_tool_use"},
    "none": set(),
}


def _check_tools(body: dict[str, Any]) -> str | None:
    """Tool definitions (a name, an object input_schema, no unknown fields) and tool_choice."""
    tools = body.get("tools", [])
    if not isinstance(tools, list):
        return "tools: Input should be a valid list"
    names = set()
    for number, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            return f"tools.{number}.name: Field required"
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return f"tools.{number}.input_schema: Field required (a JSON Schema of type object)"
        for extra in sorted(set(tool) - _TOOL_FIELDS):
            return f"tools.{number}.{extra}: Extra inputs are not permitted"
        names.add(tool["name"])
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if "tools" not in body:
        return "tool_choice may only be specified while providing tools"
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in _CHOICE_FIELDS:
        return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
    for extra in sorted(set(choice) - {"type"} - _CHOICE_FIELDS[kind]):
        return f"tool_choice.{kind}.{extra}: Extra inputs are not permitted"
    if kind == "tool" and choice.get("name") not in names:
        return f"tool_choice.tool.name: no tool named {choice.get('name')!r} in tools"
    if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
        return f"tool_choice.{kind}.disable_parallel_tool_use: Input should be a valid boolean"
    return None


def _check_blocks(messages: list[dict[str, Any]], *, tools: bool) -> str | None:
    """Content blocks: text not blank, images well formed, calls in assistant turns, results in
    user turns, tools defined when either appears, and each turn of calls answered by results
    that open the next turn, before any text or image (and name only those calls)."""
    called: list[str] = []  # the tool_use ids of the turn before
    for number, item in enumerate(messages):
        content = item.get("content")
        if isinstance(content, str):
            blocks: list[Any] = []
        elif isinstance(content, list) and content:
            blocks = content
        else:
            return f"messages.{number}.content: Input should be a string or a non-empty list"
        for index, block in enumerate(blocks):
            problem = _check_block(block, item["role"], f"messages.{number}.content.{index}")
            if problem is not None:
                return problem
        kinds = [b["type"] for b in blocks]
        if not tools and ({"tool_use", "tool_result"} & set(kinds)):
            return "Requests which include `tool_use` or `tool_result` blocks must define tools."
        # The results must be the turn's first blocks: one after a text or an image is not read.
        leading = next((i for i, k in enumerate(kinds) if k != "tool_result"), len(kinds))
        answered = [b["tool_use_id"] for b in blocks[:leading] if b["type"] == "tool_result"]
        if called and sorted(answered) != sorted(called):
            return (
                f"messages.{number - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(sorted(set(called) - set(answered)))}. Each "
                "`tool_use` block must have a corresponding `tool_result` block in the next "
                "message."
            )
        for block in blocks:
            if block["type"] == "tool_result" and block["tool_use_id"] not in called:
                return (
                    f"messages.{number}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block['tool_use_id']}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
        called = [b["id"] for b in blocks if b["type"] == "tool_use"]
    return None


def _check_block(block: Any, role: str, where: str) -> str | None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str) or not text.strip():
            return f"{where}.text: text content blocks must contain non-whitespace text"
    elif kind == "tool_use":
        if role != "assistant":
            return f"{where}: tool_use blocks may only appear in assistant messages"
        fields = (block.get("id"), block.get("name"), block.get("input"))
        if not (isinstance(fields[0], str) and isinstance(fields[1], str)):
            return f"{where}: tool_use blocks need a string id and name"
        if not isinstance(fields[2], dict):
            return f"{where}.input: Input should be a valid dictionary"
    elif kind == "tool_result":
        if role != "user":
            return f"{where}: tool_result blocks may only appear in user messages"
        if not isinstance(block.get("tool_use_id"), str):
            return f"{where}.tool_use_id: Field required"
        if not isinstance(block.get("content", ""), str | list):
            return f"{where}.content: Input should be a valid string or list"
    elif kind == "image":
        return _check_image(block, where)
    else:
        return f"{where}.type: Input tag {kind!r} does not match any of the expected tags"
    return None


IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
# The fields of each image source type. A "file" source (file_id) needs the Files API beta
# header, which nothing here sends, so the fake knows only these two.
_SOURCE_FIELDS = {"base64": {"type", "media_type", "data"}, "url": {"type", "url"}}


def _check_image(block: dict[str, Any], where: str) -> str | None:
    """An image block: a base64 source of a media type the API takes, or a url source; no
    unknown fields (OpenAI's ``detail`` included)."""
    for extra in sorted(set(block) - {"type", "source", "cache_control"}):
        return f"{where}.image.{extra}: Extra inputs are not permitted"
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if not isinstance(source, dict) or kind not in _SOURCE_FIELDS:
        return (
            f"{where}.image.source: Input tag {kind!r} found using 'type' does not match any of "
            "the expected tags: 'base64', 'url'"
        )
    for extra in sorted(set(source) - _SOURCE_FIELDS[kind]):
        return f"{where}.image.source.{kind}.{extra}: Extra inputs are not permitted"
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return f"{where}.image.source.url.url: Input should be an http(s) URL"
        return None
    if source.get("media_type") not in IMAGE_MEDIA_TYPES:
        return (
            f"{where}.image.source.base64.media_type: Input should be "
            f"{', '.join(map(repr, IMAGE_MEDIA_TYPES))}"
        )
    data = source.get("data")
    try:
        if not isinstance(data, str) or not b64decode(data, validate=True):
            raise ValueError(data)
    except (binascii.Error, ValueError):
        return f"{where}.image.source.base64.data: invalid base64 data"
    return None
