"""Worker adapter for the Anthropic Messages API (``POST {base_url}/v1/messages``).

Wire format: https://docs.anthropic.com/en/api/messages, /en/api/messages-streaming and
/en/api/errors. Anthropic differs from OpenAI in the request (system prompt outside the message
list, strictly alternating turns, temperature 0..1), in usage (``input_tokens`` leaves out cache
reads and writes) and in the stream (named events ending ``message_stop``). HTTP failures map
onto the typed errors in ``conductor_adapters.http_wire``; the adapter makes exactly one call per
``complete`` or ``stream`` and never retries (the gateway does).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, cast

from httpx_sse import ServerSentEvent

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import MalformedResponse, ProviderUnavailable
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
from conductor_gateway.providers.turns import system_and_turns

API_VERSION = "2023-06-01"
MESSAGES_PATH = "/v1/messages"
MAX_TEMPERATURE = 1.0  # Anthropic refuses more; pool specs allow up to 2 (OpenAI's range)
# The API refuses a conversation whose first turn is the assistant's; this stands in for the
# user turn the caller left out, so a transcript that opens with a model answer still goes.
OPENING_USER_TURN = "(continued conversation)"


def build_request(
    model: str,
    messages: Sequence[ChatMessage],
    max_tokens: int,
    temperature: float,
    *,
    stream: bool = False,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/messages``: system lifted out, turns merged to alternate."""
    system, merged = system_and_turns(messages)
    turns = [{"role": role, "content": text} for role, text in merged]
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
    if stream:
        payload["stream"] = True
    return payload


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
    for number, raw in enumerate(content):
        block = json_object(raw, f"content[{number}]")
        if block.get("type") == "text":  # thinking, tool_use and the like are not the answer
            text = block.get("text")
            if not isinstance(text, str):
                raise MalformedResponse(
                    f"content[{number}].text must be a string, got {kind(text)}"
                )
            parts.append(text)
    return Completion(
        text="".join(parts),
        usage=parse_usage(body.get("usage")),
        model=_string(body, "model") or "",
        finish_reason=_string(body, "stop_reason"),
    )


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
        payload = build_request(self.model, messages, max_tokens, temperature)
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
        payload = build_request(self.model, messages, max_tokens, temperature, stream=True)
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
