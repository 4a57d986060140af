"""The OpenAI Chat Completions wire format, shared by the worker gateway and the planner.

Both services speak to OpenAI-compatible endpoints (api.openai.com, vLLM, llama.cpp), so the
request body and the parsers of the answer (whole, or streamed as ``chat.completion.chunk``
events ending ``data: [DONE]``) live here once. Calls go through
``conductor_adapters.http_wire``, which maps failures onto the typed exception tree; nothing here
retries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Completion, ToolCall, ToolUse, Usage
from conductor.errors import MalformedResponse
from conductor.streaming import StreamEnd, StreamEvent, TextDelta
from conductor_adapters.http_wire import (
    error_detail,
    json_event,
    json_object,
    kind,
    new_client,
    post_json,
    stream_sse,
    token_count,
    truncate,
)

DONE = "[DONE]"


def build_chat_request(
    model: str,
    messages: Sequence[ChatMessage],
    max_tokens: int,
    temperature: float,
    response_format: Mapping[str, Any] | None = None,
    *,
    stream: bool = False,
    max_tokens_field: str = "max_tokens",
    tools: ToolUse | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions``.

    api.openai.com takes ``max_completion_tokens`` (its reasoning models refuse ``max_tokens``);
    vLLM, llama.cpp and most look-alikes still read ``max_tokens``.
    """
    payload: dict[str, Any] = {
        "model": model,
        "messages": [wire_message(m) for m in messages],
        max_tokens_field: max_tokens,
        "temperature": temperature,
    }
    if response_format is not None:
        payload["response_format"] = dict(response_format)
    if tools is not None:
        payload.update(wire_tools(tools))
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    return payload


def wire_response_format(answer_format: AnswerFormat) -> dict[str, Any]:
    """The answer's required form as Chat Completions' ``response_format``: a JSON object, or
    one that follows a JSON Schema (not ``strict``: OpenAI's strict mode refuses schemas
    without ``additionalProperties: false`` everywhere, which clients rarely write)."""
    if answer_format.json_schema is None:
        return {"type": "json_object"}
    schema = {"name": answer_format.name or "answer", "schema": answer_format.json_schema}
    return {"type": "json_schema", "json_schema": schema}


def wire_message(message: ChatMessage) -> dict[str, Any]:
    wired: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.images:  # text, then the images, as content parts
        parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
        for image in message.images:
            url: dict[str, Any] = {"url": image.url}
            if image.detail is not None:
                url["detail"] = image.detail
            parts.append({"type": "image_url", "image_url": url})
        wired["content"] = parts if message.content else parts[1:]
    if message.tool_calls:
        wired["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
        wired["content"] = message.content or None  # a turn of calls alone has no text
    if message.tool_call_id is not None:
        wired["tool_call_id"] = message.tool_call_id
    return wired


def wire_tools(tools: ToolUse) -> dict[str, Any]:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` as Chat Completions takes them."""
    functions = []
    for tool in tools.tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.parameters is not None:
            function["parameters"] = tool.parameters
        if tool.strict is not None:
            function["strict"] = tool.strict
        functions.append({"type": "function", "function": function})
    choice: Any = tools.choice
    if choice not in ("auto", "none", "required"):
        choice = {"type": "function", "function": {"name": choice}}
    wired: dict[str, Any] = {"tools": functions, "tool_choice": choice}
    if tools.parallel is not None:
        wired["parallel_tool_calls"] = tools.parallel
    return wired


def parse_tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedResponse(f"message.tool_calls must be a list, got {kind(raw)}")
    calls = []
    for i, item in enumerate(raw):
        call = json_object(item, f"message.tool_calls[{i}]")
        function = json_object(call.get("function"), f"message.tool_calls[{i}].function")
        ident, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if not (isinstance(ident, str) and isinstance(name, str) and isinstance(arguments, str)):
            raise MalformedResponse(
                f"message.tool_calls[{i}] needs a string id, function.name and function.arguments"
            )
        calls.append(ToolCall(id=ident, name=name, arguments=arguments))
    return tuple(calls)


def parse_chat_response(body: Any) -> Completion:
    """Read a chat.completion object; anything off-format is MalformedResponse, never KeyError."""
    if not isinstance(body, dict):
        raise MalformedResponse(f"expected a JSON object, got {kind(body)}")
    if "error" in body and "choices" not in body:
        raise MalformedResponse(f"2xx response carries an error: {error_detail(body)}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"'choices' must be a non-empty list, got {kind(choices)}")
    choice = json_object(choices[0], "choices[0]")
    message = json_object(choice.get("message"), "choices[0].message")
    content = message.get("content")
    tool_calls = parse_tool_calls(message.get("tool_calls"))
    if content is None and tool_calls:
        content = ""  # a turn of calls alone
    if not isinstance(content, str):
        refusal = message.get("refusal")
        why = f" (the model refused: {truncate(refusal)})" if isinstance(refusal, str) else ""
        raise MalformedResponse(
            f"choices[0].message.content must be a string, got {kind(content)}{why}"
        )
    return Completion(
        text=content,
        usage=parse_usage(body.get("usage")),
        model=_model(body),
        finish_reason=_finish_reason(choice),
        tool_calls=tool_calls,
    )


def parse_usage(raw: Any) -> Usage:
    """OpenAI usage; required, since cost accounting and token quotas depend on it."""
    usage = json_object(raw, "usage")
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    prompt_details = json_object(prompt_details, "usage.prompt_tokens_details")
    completion_details = json_object(completion_details, "usage.completion_tokens_details")
    return Usage(
        prompt_tokens=token_count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
        completion_tokens=token_count(usage.get("completion_tokens"), "usage.completion_tokens"),
        cached_tokens=token_count(
            prompt_details.get("cached_tokens"), "usage.cached_tokens", default=0
        ),
        reasoning_tokens=token_count(
            completion_details.get("reasoning_tokens"), "usage.reasoning_tokens", default=0
        ),
    )


async def read_chat_stream(events: AsyncIterator[Any], provider: str) -> AsyncIterator[StreamEvent]:
    """Translate ``chat.completion.chunk`` events into TextDelta events and one StreamEnd.

    The end is ``data: [DONE]``; usage arrives in the last chunk before it (``stream_options.
    include_usage``). A stream that stops before ``[DONE]`` yields no StreamEnd.
    """
    usage: Usage | None = None
    finish_reason: str | None = None
    model = ""
    async for event in events:
        if event.data == DONE:
            if usage is None:
                raise MalformedResponse(
                    f"{provider}: the stream carried no usage "
                    "(does the server honour stream_options.include_usage?)"
                )
            yield StreamEnd(usage=usage, finish_reason=finish_reason, model=model)
            return
        chunk = _chunk(event.data, provider)
        model = _model(chunk) or model
        if chunk.get("usage") is not None:
            usage = parse_usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            choice = json_object(choice, "choices[]")
            finish_reason = _finish_reason(choice) or finish_reason
            delta = json_object(choice.get("delta") or {}, "choices[].delta")
            text = delta.get("content")
            if isinstance(text, str) and text:
                yield TextDelta(text)


def _chunk(data: str, provider: str) -> dict[str, Any]:
    try:
        chunk = json_event(data)
    except MalformedResponse as exc:
        raise MalformedResponse(f"{provider}: {exc}") from exc
    if "error" in chunk:
        # Errors that happen after the 200 arrive inside the stream.
        raise MalformedResponse(f"{provider}: error inside the stream: {error_detail(chunk)}")
    return chunk


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model", "")
    if not isinstance(model, str):
        raise MalformedResponse(f"'model' must be a string, got {kind(model)}")
    return model


def _finish_reason(choice: Mapping[str, Any]) -> str | None:
    finish_reason = choice.get("finish_reason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise MalformedResponse(f"finish_reason must be a string, got {kind(finish_reason)}")
    return finish_reason


class OpenAIChatClient:
    """One Chat Completions endpoint: URL, key and an HTTP client, owned or borrowed.

    Shared by the worker adapter and the planner backend, which differ only in what they ask.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        client: httpx.AsyncClient | None = None,
        provider: str | None = None,
        max_tokens_field: str = "max_tokens",
    ) -> None:
        self.model = model
        self.timeout_s = timeout_s
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.provider = provider or httpx.URL(self.url).host or self.url
        self.max_tokens_field = max_tokens_field
        self._headers = auth_headers(api_key)
        self._owns_client = client is None
        self._client = client if client is not None else new_client()

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float,
        response_format: Mapping[str, Any] | None = None,
        tools: ToolUse | None = None,
    ) -> Completion:
        payload = build_chat_request(
            self.model,
            messages,
            max_tokens,
            temperature,
            response_format=response_format,
            max_tokens_field=self.max_tokens_field,
            tools=tools,
        )
        body = await post_json(
            self._client, self.url, self._headers, payload, self.timeout_s, self.provider
        )
        try:
            return parse_chat_response(body)
        except MalformedResponse as exc:
            raise MalformedResponse(f"{self.provider}: {exc}", status_code=200) from exc

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        payload = build_chat_request(
            self.model,
            messages,
            max_tokens,
            temperature,
            stream=True,
            max_tokens_field=self.max_tokens_field,
        )
        events = stream_sse(
            self._client, self.url, self._headers, payload, self.timeout_s, self.provider
        )
        return read_chat_stream(events, self.provider)

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it; a borrowed one is its owner's."""
        if self._owns_client:
            await self._client.aclose()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"OpenAIChatClient(model={self.model!r}, url={self.url!r})"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer`` when a key is set; keyless local servers get no header at all."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
