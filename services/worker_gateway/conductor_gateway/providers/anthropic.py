"""Worker adapter for the Anthropic Messages API (``POST {base_url}/v1/messages``).

Wire format: https://docs.anthropic.com/en/api/messages, /en/api/messages-streaming and
/en/api/errors. Anthropic differs from OpenAI in the request (system prompt outside the message
list, strictly alternating turns, temperature 0..1), in usage (``input_tokens`` leaves out cache
reads and writes) and in the stream (named events ending ``message_stop``). HTTP failures map
onto the typed errors in ``conductor_adapters.http_wire``; the adapter makes exactly one call per
``complete``, ``complete_with_tools`` or ``stream`` and never retries (the gateway does).

Function calling (/en/docs/agents-and-tools/tool-use): tools go as ``{name, description,
input_schema}`` with a ``tool_choice`` object; the model's calls come back as ``tool_use`` blocks
(``input`` an object, not JSON text) and their results go back as ``tool_result`` blocks of a user
turn, which must start the turn that follows the calls.

Vision (/en/docs/build-with-claude/vision): a user message's images go as ``image`` blocks, a
data URL's bytes as a ``base64`` source and an http(s) URL as a ``url`` source the API fetches.

Structured outputs (/en/docs/build-with-claude/structured-outputs, "JSON outputs"): an answer that
must follow a JSON Schema goes with ``output_config: {"format": {"type": "json_schema", "schema":
...}}``, generally available with no beta header (the beta's top-level ``output_format`` and its
``anthropic-beta: structured-outputs-2025-11-13`` header are deprecated). The model decodes under
the schema's grammar, and the API refuses (400) a schema with an object whose
``additionalProperties`` is not ``false``, or with constraints it cannot enforce; so the schema is
first made one it takes (``strict_schema``), and what cannot be is asked in the prompt only.
"""

from __future__ import annotations

import binascii
import contextlib
import json
import re
from base64 import b64decode
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from httpx_sse import ServerSentEvent
from pydantic import ValidationError

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Completion, ImagePart, ToolCall, ToolUse, Usage
from conductor.errors import MalformedResponse, ProviderRejected, ProviderUnavailable
from conductor.pool import Provider
from conductor.streaming import StreamEnd, StreamEvent, TextDelta
from conductor_adapters.http_wire import (
    error_detail,
    json_event,
    json_object,
    kind,
    post_json,
    stream_sse,
    token_count,
)
from conductor_gateway.providers.endpoint import HttpWorker

API_VERSION = "2023-06-01"
MESSAGES_PATH = "/v1/messages"
MAX_TEMPERATURE = 1.0  # Anthropic refuses more; pool specs allow up to 2 (OpenAI's range)
# The API refuses a conversation whose first turn is the assistant's; this stands in for the
# user turn the caller left out, so a transcript that opens with a model answer still goes.
OPENING_USER_TURN = "(continued conversation)"
# tool_choice types by ToolUse.choice; any other choice names the one tool to call.
TOOL_CHOICES = {"auto": "auto", "required": "any", "none": "none"}
# Stop reasons renamed to the OpenAI finish_reason clients act on; the others pass as they are.
FINISH_REASONS = {"tool_use": "tool_calls"}
# input_schema is required: a function without parameters takes an empty object.
_NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}
# The media types the API takes in a base64 image source; it refuses any other with a 400.
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
# Models older than those the structured-outputs docs list (the 4.5 family on): they refuse
# output_config.format, so their answers are asked for in the prompt only.
_NO_STRUCTURED_OUTPUTS = re.compile(
    r"claude-(?:instant|2|3|(?:sonnet|opus)-4-(?:(?:0|1)(?!\d)|2025\d{4}))"
)
# Keywords structured outputs refuse ("JSON Schema limitations": numeric, string and array bounds
# beyond minItems 0 or 1). They are left out of what is sent (a larger minItems goes as 1): the
# prompt still states the whole schema and the caller validates the answer against it.
_UNENFORCED = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "minProperties",
        "maxProperties",
    }
)


def build_request(
    model: str,
    messages: Sequence[ChatMessage],
    max_tokens: int,
    temperature: float,
    *,
    stream: bool = False,
    tools: ToolUse | None = None,
    output_format: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/messages``: system lifted out, turns merged to alternate.

    Tool calls and results travel as blocks only with ``tools``: the API refuses ``tool_use`` and
    ``tool_result`` blocks in a request that defines no tools, so without them they are text.
    ``output_format`` goes as ``output_config.format`` unless the last turn is the assistant's:
    the API refuses prefilled answers with JSON outputs, so such an answer is asked for in the
    prompt only.
    """
    system, turns = wire_turns(messages, tool_blocks=tools is not None)
    if turns and turns[0]["role"] == "assistant":
        turns.insert(0, {"role": "user", "content": OPENING_USER_TURN})
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": turns,
        "temperature": min(max(temperature, 0.0), MAX_TEMPERATURE),
    }
    if system is not None:
        payload["system"] = system
    if tools is not None:
        payload.update(wire_tools(tools))
    if output_format is not None and turns and turns[-1]["role"] == "user":
        payload["output_config"] = {"format": dict(output_format)}
    if stream:
        payload["stream"] = True
    return payload


def wire_output_format(model: str, answer_format: AnswerFormat) -> dict[str, Any] | None:
    """``output_config.format`` for an answer in ``answer_format``, or None where Anthropic cannot
    be asked natively: a model older than structured outputs, a schema it cannot take as it
    means (``strict_schema``), and ``json_object``. Anthropic has no JSON mode: a schema of
    ``{"type": "object"}`` is refused (objects must set ``additionalProperties: false``), and
    with that set only ``{}`` would fit."""
    if answer_format.json_schema is None or _NO_STRUCTURED_OUTPUTS.search(model):
        return None
    schema = strict_schema(answer_format.json_schema)
    return None if schema is None else {"type": "json_schema", "schema": schema}


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` as structured outputs take it, or None when it cannot be without asking for
    answers the client's schema refuses.

    Every object gets ``additionalProperties: false`` (the API requires it): this only narrows
    what the model may write, so its answers still follow the client's schema. Constraints it
    cannot enforce are left out or eased, and ``oneOf`` goes as ``anyOf`` (which the docs list;
    it lets through no less). None for what has no such form: an object without
    ``properties`` (a map, or any object, where false would leave only ``{}``), one that
    requires keys it does not list or has ``patternProperties``, ``not`` (which the docs do not
    list), and a recursive or external ``$ref`` (which the API refuses).
    """
    if _recursive_or_external(schema):
        return None
    try:
        closed: dict[str, Any] = _closed(schema)
    except _NoStrictForm:
        return None
    return closed


class _NoStrictForm(Exception):
    """A schema (or part of one) that structured outputs cannot take as the client means it."""


def _closed(node: Any) -> Any:
    """``node`` with its objects closed and unenforced keywords left out (``strict_schema``)."""
    if not isinstance(node, dict):
        return node  # a boolean schema, or a keyword's value
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _UNENFORCED:
            continue
        if key == "minItems" and isinstance(value, int) and value > 1:
            out[key] = 1  # the most it takes: at least one item, as near as it can come
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _closed(sub) for name, sub in value.items()}
        elif key in ("anyOf", "allOf", "oneOf", "prefixItems") and isinstance(value, list):
            if key == "oneOf" and "anyOf" in node:
                raise _NoStrictForm
            out["anyOf" if key == "oneOf" else key] = [_closed(sub) for sub in value]
        elif key == "items":
            out[key] = _closed(value)
        elif key == "not":
            raise _NoStrictForm  # closing an object under "not" would widen, not narrow
        else:
            out[key] = value
    kind = node.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node:
        properties = node.get("properties")
        required = node.get("required") or []
        if not isinstance(properties, dict) or "patternProperties" in node:
            raise _NoStrictForm
        if not set(required) <= set(properties):
            raise _NoStrictForm
        out["additionalProperties"] = False
    return out


def _recursive_or_external(schema: Mapping[str, Any]) -> bool:
    """Whether a ``$ref`` leads back to a schema it is in, or outside this document."""
    targets: dict[str, Any] = {"#": schema}
    for key in ("$defs", "definitions"):
        defs = schema.get(key)
        if isinstance(defs, dict):
            targets.update({f"#/{key}/{name}": sub for name, sub in defs.items()})
    refs = {target: set(_refs(node)) for target, node in targets.items()}
    if any(not ref.startswith("#") for found in refs.values() for ref in found):
        return True
    visiting: set[str] = set()
    done: set[str] = set()

    def loops(target: str) -> bool:
        if target in visiting:
            return True
        if target in done:
            return False
        visiting.add(target)
        found = any(loops(ref) for ref in refs.get(target, ()))
        visiting.discard(target)
        done.add(target)
        return found

    return any(loops(target) for target in refs)


def _refs(node: Any) -> Iterator[str]:
    """Every ``$ref`` in ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def wire_tools(tools: ToolUse) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` as the Messages API takes them. OpenAI's ``strict`` is left
    out: Anthropic took it only in a beta (structured outputs), and refuses fields it does not
    know."""
    specs = []
    for tool in tools.tools:
        schema = tool.parameters if tool.parameters is not None else _NO_PARAMETERS
        spec: dict[str, Any] = {"name": tool.name, "input_schema": dict(schema)}
        if tool.description is not None:
            spec["description"] = tool.description
        specs.append(spec)
    choice: dict[str, Any] = {"type": TOOL_CHOICES.get(tools.choice, "tool")}
    if choice["type"] == "tool":
        choice["name"] = tools.choice
    if tools.parallel is False and choice["type"] != "none":  # "none" takes no such field
        choice["disable_parallel_tool_use"] = True
    return {"tools": specs, "tool_choice": choice}


@dataclass
class _Turn:
    """One wire turn being merged: its body (text blocks, and the images its user messages show,
    in order) and its tool blocks (calls or results)."""

    role: Literal["user", "assistant"]
    body: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def add_text(self, text: str) -> None:
        """Consecutive texts make one text block, a blank line apart."""
        if self.body and self.body[-1]["type"] == "text":
            self.body[-1]["text"] += f"\n\n{text}"
        else:
            self.body.append({"type": "text", "text": text})

    def wire(self) -> dict[str, Any]:
        if not self.blocks and all(b["type"] == "text" for b in self.body):
            return {"role": self.role, "content": self.body[0]["text"] if self.body else ""}
        lead = [b for b in self.body if b["type"] != "text" or b["text"].strip()]  # none blank
        # Results open the user turn (the API looks for them first); calls close the assistant's.
        content = [*lead, *self.blocks] if self.role == "assistant" else [*self.blocks, *lead]
        return {"role": self.role, "content": content}


def wire_turns(
    messages: Sequence[ChatMessage], *, tool_blocks: bool
) -> tuple[str | None, list[dict[str, Any]]]:
    """The system messages joined, and the other turns merged so that roles alternate.

    A ``tool`` message is a user turn to Anthropic: results that follow one assistant turn, and a
    user message after them, make one user turn. Consecutive texts of a turn are kept a blank
    line apart. ``tool_blocks`` False writes calls and results as text; images are blocks either
    way (they need no tools).
    """
    system = [m.content for m in messages if m.role == "system"]
    turns: list[_Turn] = []
    for number, message in enumerate(messages):
        if message.role == "system":
            continue
        role: Literal["user", "assistant"] = "assistant" if message.role == "assistant" else "user"
        if not turns or turns[-1].role != role:
            turns.append(_Turn(role))
        turn = turns[-1]
        if message.role == "tool":
            if tool_blocks:
                turn.blocks.append(_tool_result(message))
            else:
                turn.add_text(f"Tool result ({message.tool_call_id}): {message.content}")
            continue
        if message.role == "user":
            # Each message's images go before its own text: the vision docs find Claude works
            # best with an image-then-text structure (images after text only nearly as well).
            for index, image in enumerate(message.images):
                turn.body.append(_image(image, f"messages[{number}].images[{index}]"))
        if message.content or not (message.tool_calls or message.images):
            turn.add_text(message.content)
        for index, call in enumerate(message.tool_calls):
            if tool_blocks:
                turn.blocks.append(_tool_use(call, f"messages[{number}].tool_calls[{index}]"))
            else:
                turn.add_text(f"[called {call.name}({call.arguments})]")
    return ("\n\n".join(system) if system else None), [t.wire() for t in turns]


def _tool_use(call: ToolCall, where: str) -> dict[str, Any]:
    """A call as an assistant ``tool_use`` block. Its arguments must be a JSON object (the API
    takes ``input`` as one): anything else is the request's fault, and sending it again cannot
    help, so it is ProviderRejected before anything is sent."""
    text = call.arguments
    try:
        # Blank arguments are a call without any (some OpenAI-compatible servers write them so).
        arguments = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ProviderRejected(
            f"{where} ({call.name!r}, id {call.id!r}): arguments are not JSON ({exc}); "
            "Anthropic takes a tool call's arguments as a JSON object"
        ) from exc
    if not isinstance(arguments, dict):
        raise ProviderRejected(
            f"{where} ({call.name!r}, id {call.id!r}): arguments must be a JSON object, "
            f"got {kind(arguments)}"
        )
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def _image(image: ImagePart, where: str) -> dict[str, Any]:
    """An image as a user ``image`` block (``detail`` is OpenAI's: Anthropic has no such field and
    refuses fields it does not know). A data URL the API would refuse, not base64 or of a media
    type it does not take, is the request's fault: ProviderRejected before anything is sent, as
    sending it again cannot help."""
    inline = image.inline
    if inline is None:
        if not image.url[:8].lower().startswith(("http://", "https://")):
            raise ProviderRejected(
                f"{where}: Anthropic takes an image as a base64 data URL or an http(s) URL"
            )
        return {"type": "image", "source": {"type": "url", "url": image.url}}
    media_type, data = inline
    media_type = media_type.lower()  # media types are case-insensitive; the API's list is lower
    if media_type not in IMAGE_MEDIA_TYPES:
        raise ProviderRejected(
            f"{where}: Anthropic takes images of media type {', '.join(IMAGE_MEDIA_TYPES)}, "
            f"not {media_type or '(none)'!r}"
        )
    if not image.url.partition(",")[0].endswith(";base64") or not _is_base64(data):
        raise ProviderRejected(
            f"{where}: the data URL is not base64; Anthropic takes an inline image's bytes only "
            "as base64"
        )
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _is_base64(data: str) -> bool:
    """Non-empty, and standard base64 the API can decode (no URL-safe letters, no spaces)."""
    try:
        return bool(data) and bool(b64decode(data, validate=True))
    except (binascii.Error, ValueError):  # ValueError: characters beyond ASCII
        return False


def _tool_result(message: ChatMessage) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    if message.content:  # optional: a result with no text sends none
        block["content"] = message.content
    return block


def parse_response(body: Any) -> Completion:
    """Read a ``message`` object; anything off-format is MalformedResponse, never KeyError."""
    if not isinstance(body, dict):
        raise MalformedResponse(f"expected a JSON object, got {kind(body)}")
    if body.get("type") == "error":
        raise MalformedResponse(f"2xx response carries an error: {error_detail(body)}")
    content = body.get("content")
    if not isinstance(content, list):
        raise MalformedResponse(f"'content' must be a list, got {kind(content)}")
    parts: list[str] = []
    calls: list[ToolCall] = []
    for number, raw in enumerate(content):
        block = json_object(raw, f"content[{number}]")
        if block.get("type") == "text":  # thinking and the like are not the answer
            text = block.get("text")
            if not isinstance(text, str):
                raise MalformedResponse(
                    f"content[{number}].text must be a string, got {kind(text)}"
                )
            parts.append(text)
        elif block.get("type") == "tool_use":
            calls.append(_tool_call(block, f"content[{number}]"))
    stop_reason = _string(body, "stop_reason")
    return Completion(
        text="".join(parts),
        usage=parse_usage(body.get("usage")),
        model=_string(body, "model") or "",
        finish_reason=stop_reason and FINISH_REASONS.get(stop_reason, stop_reason),
        tool_calls=tuple(calls),
    )


def _tool_call(block: Mapping[str, Any], where: str) -> ToolCall:
    """A ``tool_use`` block as a call: its ``input`` object becomes the JSON text clients read."""
    ident, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not (isinstance(ident, str) and isinstance(name, str) and isinstance(arguments, dict)):
        raise MalformedResponse(
            f"{where} (tool_use) needs a string id and name, and an input object"
        )
    try:
        return ToolCall(id=ident, name=name, arguments=json.dumps(arguments))
    except ValidationError as exc:  # an empty or overlong id or name
        raise MalformedResponse(f"{where} (tool_use): {exc.errors()[0]['msg']}") from exc


def parse_usage(raw: Any) -> Usage:
    """Anthropic usage in our terms: ``input_tokens`` leaves out cache reads and cache writes,
    so the prompt is the three summed; required, since cost accounting depends on it."""
    usage = json_object(raw, "usage")
    fresh = token_count(usage.get("input_tokens"), "usage.input_tokens")
    written = token_count(usage.get(_WRITTEN), f"usage.{_WRITTEN}", default=0)
    read = token_count(usage.get(_READ), f"usage.{_READ}", default=0)
    return Usage(
        prompt_tokens=fresh + written + read,
        completion_tokens=token_count(usage.get("output_tokens"), "usage.output_tokens"),
        cached_tokens=read,
    )


_WRITTEN = "cache_creation_input_tokens"
_READ = "cache_read_input_tokens"
_STREAM_EVENTS = frozenset(
    {"message_start", "content_block_delta", "message_delta", "message_stop", "error"}
)


async def read_stream(
    events: AsyncIterator[ServerSentEvent], provider: str
) -> AsyncIterator[StreamEvent]:
    """Translate Messages API events into TextDelta events and one StreamEnd at ``message_stop``.

    Usage starts in ``message_start``; ``message_delta`` brings the cumulative output count (and,
    in newer API versions, final input counts). A stream that stops before ``message_stop``
    yields no StreamEnd. Other events (ping, block start/stop, new kinds) are skipped, as the
    streaming docs ask of clients.
    """
    counts: dict[str, Any] | None = None
    finish_reason: str | None = None
    model = ""
    async for event in events:
        name: Any = event.event
        if name not in _STREAM_EVENTS and name != "message":  # no ``event:`` line reads "message"
            continue
        data = _event_data(event.data, provider)
        if name == "message":
            name = data.get("type")
        if name == "message_start":
            message = json_object(data.get("message"), "message_start.message")
            model = _string(message, "model") or model
            counts = dict(json_object(message.get("usage"), "message_start.message.usage"))
        elif name == "content_block_delta":
            delta = json_object(data.get("delta"), "content_block_delta.delta")
            text = delta.get("text")
            if delta.get("type") == "text_delta" and isinstance(text, str) and text:
                yield TextDelta(text)  # thinking_delta, input_json_delta: not the answer
        elif name == "message_delta":
            if counts is None:
                raise MalformedResponse(f"{provider}: message_delta before message_start")
            delta = json_object(data.get("delta") or {}, "message_delta.delta")
            finish_reason = _string(delta, "stop_reason") or finish_reason
            usage = json_object(data.get("usage") or {}, "message_delta.usage")
            counts.update({k: v for k, v in usage.items() if v is not None})
        elif name == "message_stop":
            if counts is None:
                raise MalformedResponse(f"{provider}: message_stop without message_start")
            try:
                usage_total = parse_usage(counts)
            except MalformedResponse as exc:
                raise MalformedResponse(f"{provider}: {exc}") from exc
            yield StreamEnd(usage=usage_total, finish_reason=finish_reason, model=model)
            return
        elif name == "error":
            detail = f"{provider}: error inside the stream: {error_detail(data)}"
            error = data.get("error")
            if isinstance(error, dict) and error.get("type") == "overloaded_error":
                raise ProviderUnavailable(detail)  # the 529 that came after the 200
            raise MalformedResponse(detail)


def _event_data(data: str, provider: str) -> dict[str, Any]:
    try:
        return json_event(data)
    except MalformedResponse as exc:
        raise MalformedResponse(f"{provider}: {exc}") from exc


def _string(body: Mapping[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is not None and not isinstance(value, str):
        raise MalformedResponse(f"'{field}' must be a string, got {kind(value)}")
    return value


class AnthropicWorker(HttpWorker):
    """A ChatWorker that POSTs ``{base_url}/v1/messages`` (base_url without ``/v1``)."""

    providers = frozenset({Provider.ANTHROPIC})
    wire_format = "Anthropic Messages API"

    def configure(self, base_url: str, api_key: str | None) -> None:
        self.url = base_url + MESSAGES_PATH
        self._headers = {"anthropic-version": API_VERSION}
        if api_key:
            self._headers["x-api-key"] = api_key

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        return await self._call(self._request(messages, max_tokens, temperature))

    async def complete_with_tools(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolUse,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """One whole (not streamed) call: its tool calls go back to the client in one answer."""
        return await self._call(self._request(messages, max_tokens, temperature, tools=tools))

    async def complete_in_format(
        self,
        messages: Sequence[ChatMessage],
        answer_format: AnswerFormat,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """One whole call whose answer Anthropic constrains to the schema where it can
        (``wire_output_format``); otherwise a plain call, the prompt's instruction alone."""
        output_format = wire_output_format(self.model, answer_format)
        payload = self._request(messages, max_tokens, temperature, output_format=output_format)
        return await self._call(payload)

    def _request(
        self,
        messages: Sequence[ChatMessage],
        max_tokens: int,
        temperature: float,
        *,
        stream: bool = False,
        tools: ToolUse | None = None,
        output_format: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``build_request``, its refusals (tool arguments, images) naming this worker."""
        try:
            return build_request(
                self.model,
                messages,
                max_tokens,
                temperature,
                stream=stream,
                tools=tools,
                output_format=output_format,
            )
        except ProviderRejected as exc:
            raise ProviderRejected(f"{self.provider}: {exc}") from exc

    async def _call(self, payload: Mapping[str, Any]) -> Completion:
        body = await post_json(
            self._client, self.url, self._headers, payload, self.timeout_s, self.provider
        )
        try:
            return parse_response(body)
        except MalformedResponse as exc:
            raise MalformedResponse(f"{self.provider}: {exc}", status_code=200) from exc

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        payload = self._request(messages, max_tokens, temperature, stream=True)
        # stream_sse is an async generator (typed as an iterator); closing it at once hands the
        # connection back as soon as message_stop is read or the caller stops reading.
        source = cast(
            AsyncGenerator[ServerSentEvent, None],
            stream_sse(
                self._client, self.url, self._headers, payload, self.timeout_s, self.provider
            ),
        )
        async with contextlib.aclosing(source) as events:
            async for event in read_stream(events, self.provider):
                yield event
