"""Worker adapter for Google's Gemini API: ``generateContent`` and ``streamGenerateContent``.

Wire format: https://ai.google.dev/api/generate-content (bodies, usage, finish reasons) and
https://ai.google.dev/gemini-api/docs/troubleshooting (error statuses). The key travels in the
``x-goog-api-key`` header, never in the URL, so it cannot leak into logs of URLs. Like every
adapter, this makes exactly one HTTP call per ``complete`` or ``stream``; retries, quotas and
cost accounting belong to the gateway around it.

Usage mapping: Gemini bills thinking tokens (``thoughtsTokenCount``) as output but reports them
apart from ``candidatesTokenCount``, so ``completion_tokens`` is their sum and
``reasoning_tokens`` the thoughts alone; ``promptTokenCount`` already includes the cached part.

Function calling (https://ai.google.dev/gemini-api/docs/function-calling, whole calls only):
tools go as ``functionDeclarations`` whose parameters travel as ``parametersJsonSchema``, the
v1beta field that takes JSON Schema as clients write it for OpenAI (``parameters`` takes only
an OpenAPI subset and refuses ``additionalProperties``, ``$schema`` and the like). A call in
the history is a ``functionCall`` part of a "model" turn; a result a ``functionResponse`` part
of a "user" turn, named by its function (Gemini matches results to calls by name and order,
so no ids are sent). Not carried: Gemini 3's ``thoughtSignature`` on a call, which
``ToolCall`` has no room for (such models may refuse a history of calls without it).

Images (https://ai.google.dev/gemini-api/docs/image-understanding and
https://ai.google.dev/gemini-api/docs/file-input-methods): a user turn's data URL goes as an
``inlineData`` part; an https URL as a ``fileData`` part that Gemini fetches itself (public or
pre-signed URLs, not for Gemini 2.0 models), its ``mimeType`` told by the URL's extension. What
Gemini would refuse (another image type, a plain http URL, a URL whose type cannot be told) is
refused before sending, as ProviderRejected: every try would fail the same way.

Structured output (https://ai.google.dev/gemini-api/docs/structured-output, and GenerationConfig in
https://ai.google.dev/api/generate-content): an answer that must be JSON goes with
``generationConfig.responseMimeType`` "application/json", and one that must follow a schema also
with ``generationConfig.responseJsonSchema``, the field that takes JSON Schema as clients write it
(``responseSchema`` takes only an OpenAPI subset). Gemini requires the MIME type with it; the
whole schema may be sent, though Gemini enforces only part of JSON Schema (the caller validates).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx
from httpx_sse import ServerSentEvent
from pydantic import ValidationError

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Completion, ImagePart, ToolCall, ToolSpec, ToolUse, Usage
from conductor.errors import (
    MalformedResponse,
    ProviderRejected,
    ProviderUnavailable,
    RateLimited,
    WorkerError,
)
from conductor.pool import Provider
from conductor.streaming import StreamEnd, StreamEvent, TextDelta
from conductor_adapters.http_wire import (
    error_detail,
    json_event,
    json_object,
    kind,
    post_json,
    retry_after_s,
    stream_sse,
    token_count,
)
from conductor_gateway.providers.endpoint import HttpWorker

API_VERSION = "v1beta"
# Finish reasons of an answer the model completed (or ran out of room for); any other reason
# with no text means Google withheld the answer (SAFETY, RECITATION, PROHIBITED_CONTENT, ...).
ANSWERED = frozenset({"STOP", "MAX_TOKENS"})
# A function call the model botched (broken arguments, a tool it may not call): any text beside
# it is narration, not an answer, and another sample may well make a whole call.
BOTCHED_CALL = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"})
# In-stream error statuses worth another try, as their HTTP twins (429, 500, 503, 504) are.
RETRYABLE_STATUSES = frozenset({"UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"})
# tool_choice as functionCallingConfig.mode; a tool's name is ANY limited to that tool.
CALLING_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
TOOL_CALLS = "tool_calls"  # the finish reason of an answer of calls, as OpenAI names it
# The image types Gemini reads inline (image-understanding, "Supported image formats") and those
# it fetches from a URL (file-input-methods, "Supported content types"): the lists differ.
INLINE_IMAGE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"}
)
FETCHED_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/bmp"})
# A URL's image type by its extension (fileData needs a mimeType); types Gemini refuses are
# listed too, so that the error can name them.
IMAGE_EXTENSIONS = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
    ".heic": "image/heic",
    ".heif": "image/heif",
    ".gif": "image/gif",
    ".svg": "image/svg+xml",
    ".avif": "image/avif",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
}
MEDIA_TYPE_ALIASES = {"image/jpg": "image/jpeg"}  # a common misspelling of JPEG's type


def build_request(
    messages: Sequence[ChatMessage],
    max_tokens: int,
    temperature: float,
    tools: ToolUse | None = None,
    *,
    fetches_urls: bool = True,
    answer_format: AnswerFormat | None = None,
) -> dict[str, Any]:
    """The JSON body of ``generateContent``: system text apart, assistant turns as "model".

    A history with tool calls and results is valid without ``tools`` (a client may stop
    offering them); one whose calls, results or images Gemini cannot take is ProviderRejected.
    ``fetches_urls``: whether the model fetches images from URLs (Gemini 2.0 models do not).
    ``answer_format``: the JSON the answer must be, asked of Gemini in generationConfig.
    """
    system = [m.content for m in messages if m.role == "system"]
    config: dict[str, Any] = {"maxOutputTokens": max_tokens, "temperature": temperature}
    if answer_format is not None:
        config.update(wire_answer_format(answer_format))
    payload: dict[str, Any] = {
        "contents": wire_contents(messages, fetches_urls=fetches_urls),
        "generationConfig": config,
    }
    if system:
        payload["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    if tools is not None:
        payload.update(wire_tools(tools))
    return payload


def wire_answer_format(answer_format: AnswerFormat) -> dict[str, Any]:
    """The generationConfig fields of a JSON answer: the MIME type, and the schema (as it is:
    Gemini takes JSON Schema whole) when there is one."""
    fields: dict[str, Any] = {"responseMimeType": "application/json"}
    if answer_format.json_schema is not None:
        fields["responseJsonSchema"] = answer_format.json_schema
    return fields


def wire_tools(tools: ToolUse) -> dict[str, Any]:
    """``tools`` and ``toolConfig`` as generateContent takes them. ``tools.parallel`` is not
    sent: Gemini has no switch for parallel calls (it may always make several)."""
    config: dict[str, Any] = {"mode": CALLING_MODES.get(tools.choice, "ANY")}
    if tools.choice not in CALLING_MODES:
        config["allowedFunctionNames"] = [tools.choice]
    declarations = [_declaration(tool) for tool in tools.tools]
    return {
        "tools": [{"functionDeclarations": declarations}],
        "toolConfig": {"functionCallingConfig": config},
    }


def _declaration(tool: ToolSpec) -> dict[str, Any]:
    """One FunctionDeclaration; ``strict`` has no Gemini counterpart and is not sent."""
    declaration: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        declaration["description"] = tool.description
    if tool.parameters is not None:
        declaration["parametersJsonSchema"] = tool.parameters
    return declaration


def wire_contents(
    messages: Sequence[ChatMessage], *, fetches_urls: bool = True
) -> list[dict[str, Any]]:
    """The turns other than system ones as Gemini contents.

    Consecutive turns of one role are merged, since Gemini expects the roles to alternate:
    texts a blank line apart, other parts side by side (a batch of tool results is one "user"
    turn of functionResponse parts, as Gemini asks).
    """
    names: dict[str, str] = {}  # a call's id -> its function, from the calls seen so far
    contents: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if message.role == "system":
            continue
        if message.role == "assistant":
            role, parts = "model", _model_parts(message, index, names)
        elif message.role == "tool":
            role, parts = "user", [_function_response(message, index, names)]
        else:
            role, parts = "user", _user_parts(message, index, fetches_urls)
        _append(contents, role, parts)
    return contents


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    if not contents or contents[-1]["role"] != role:
        contents.append({"role": role, "parts": parts})
        return
    merged: list[dict[str, Any]] = contents[-1]["parts"]
    if _is_text(merged[-1]) and _is_text(parts[0]):
        merged[-1] = {"text": f"{merged[-1]['text']}\n\n{parts[0]['text']}"}
        parts = parts[1:]
    merged.extend(parts)


def _is_text(part: dict[str, Any]) -> bool:
    return part.keys() == {"text"}


def _user_parts(message: ChatMessage, index: int, fetches_urls: bool) -> list[dict[str, Any]]:
    """A user turn: its text (none when it only shows images) and its images.

    Order: Gemini's tip for one image with text is the text after the image part
    (image-understanding, "Tips and best practices"); for several it gives none, and its
    multi-image example asks first, so there the text leads, as ChatMessage holds it.
    """
    images = [
        _image_part(image, f"messages[{index}].images[{n}]", fetches_urls)
        for n, image in enumerate(message.images)
    ]
    text = [{"text": message.content}] if message.content or not images else []
    return [*images, *text] if len(images) == 1 else [*text, *images]


def _image_part(image: ImagePart, where: str, fetches_urls: bool) -> dict[str, Any]:
    """An image as an inlineData part (a data URL) or a fileData part (an https URL)."""
    inline = image.inline
    if inline is None:
        media_type = _fetched_type(image.url, where, fetches_urls)
        return {"fileData": {"mimeType": media_type, "fileUri": image.url}}
    media_type, data = inline
    if not image.url.partition(",")[0].endswith(";base64") or not data:
        raise ProviderRejected(f"{where} is not a base64 data URL: Gemini takes images as base64")
    media_type = _media_type(media_type)
    if media_type not in INLINE_IMAGE_TYPES:
        raise ProviderRejected(
            f"{where} is {media_type}: Gemini takes PNG, JPEG, WEBP, HEIC or HEIF images"
        )
    return {"inlineData": {"mimeType": media_type, "data": data}}


def _fetched_type(url: str, where: str, fetches_urls: bool) -> str:
    """The media type of an image Gemini is to fetch from ``url``, told by its extension."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "https":
        raise ProviderRejected(
            f"{where} is not an https URL: Gemini fetches images only over https; send the "
            "image inline as a data URL"
        )
    if not fetches_urls:
        raise ProviderRejected(
            f"{where} is a URL, which Gemini 2.0 models do not fetch: send the image inline "
            "as a data URL"
        )
    media_type = IMAGE_EXTENSIONS.get(PurePosixPath(parts.path).suffix.lower())
    if media_type is None:
        raise ProviderRejected(
            f"{where}: the image's type cannot be told from its URL's extension, and Gemini "
            "must be told it: send the image inline as a data URL"
        )
    if media_type not in FETCHED_IMAGE_TYPES:
        raise ProviderRejected(
            f"{where} links to {media_type}: Gemini fetches PNG, JPEG, WEBP or BMP images"
        )
    return media_type


def _media_type(raw: str) -> str:
    """A data URL's media type as Gemini names it: media types are case-insensitive."""
    media_type = raw.strip().lower()
    return MEDIA_TYPE_ALIASES.get(media_type, media_type)


def _fetches_urls(model: str) -> bool:
    """Whether ``model`` fetches files from external URLs: Gemini 2.0 models do not
    (file-input-methods, "External HTTP / Signed URLs")."""
    return not model.removeprefix("models/").startswith("gemini-2.0")


def _model_parts(message: ChatMessage, index: int, names: dict[str, str]) -> list[dict[str, Any]]:
    """An assistant turn: its text (none when it only calls), then its calls."""
    parts: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        parts.append({"text": message.content})
    for n, call in enumerate(message.tool_calls):
        names[call.id] = call.name
        args = _arguments(call, f"messages[{index}].tool_calls[{n}].arguments")
        parts.append({"functionCall": {"name": call.name, "args": args}})
    return parts


def _arguments(call: ToolCall, where: str) -> dict[str, Any]:
    """A call's arguments as the object Gemini takes. OpenAI passes the text through as the
    model wrote it; Gemini needs it parsed, and a text that is not an object would fail the
    same way on every try (so ProviderRejected: not retried)."""
    if not call.arguments.strip():
        return {}  # a call with no arguments, as some servers write it
    try:
        args = json.loads(call.arguments)
    except ValueError as exc:
        raise ProviderRejected(
            f"{where} of {call.name!r} is not JSON ({exc}): Gemini takes a call's arguments "
            "as a JSON object"
        ) from None
    if not isinstance(args, dict):
        raise ProviderRejected(
            f"{where} of {call.name!r} must be a JSON object for Gemini, got {kind(args)}"
        )
    return args


def _function_response(
    message: ChatMessage, index: int, names: Mapping[str, str]
) -> dict[str, Any]:
    """A tool result, named by the function of the call it answers (Gemini matches by name).

    The result text goes whole under "output", the key Gemini reads as a function's output,
    whatever it holds: parsing JSON results would give one result two shapes by its content.
    """
    name = names.get(message.tool_call_id or "")
    if name is None:
        raise ProviderRejected(
            f"messages[{index}].tool_call_id {message.tool_call_id!r} answers no tool call of "
            "an earlier assistant message: Gemini names a result by its call's function"
        )
    return {"functionResponse": {"name": name, "response": {"output": message.content}}}


def parse_response(body: Any, model: str) -> Completion:
    """Read a GenerateContentResponse; off-format is MalformedResponse, never KeyError.

    A withheld answer (blocked prompt or candidate) is ProviderRejected: asking again gets the
    same verdict. ``model`` names the answer when the body carries no ``modelVersion``. An
    answer with function calls finishes "tool_calls", as on the OpenAI wire.
    """
    response = json_object(body, "response")
    if "error" in response and "candidates" not in response:
        raise MalformedResponse(f"2xx response carries an error: {error_detail(response)}")
    chunk = _read_chunk(response, model)
    if not response.get("candidates"):
        got = kind(response.get("candidates"))
        raise MalformedResponse(f"'candidates' must be a non-empty list, got {got}")
    if chunk.usage is None:
        raise MalformedResponse("usageMetadata must be an object, got null")
    text = "".join(chunk.texts)
    _check_withheld(chunk.finish_reason, answered=bool(text or chunk.calls))
    return Completion(
        text=text,
        usage=chunk.usage,
        model=chunk.model,
        finish_reason=TOOL_CALLS if chunk.calls else chunk.finish_reason,
        tool_calls=chunk.calls,
    )


def parse_usage(raw: Any) -> Usage:
    """Gemini usageMetadata; required, since cost accounting and token quotas depend on it."""
    usage = json_object(raw, "usageMetadata")

    def count(field: str, default: int | None = 0) -> int:
        return token_count(usage.get(field), f"usageMetadata.{field}", default=default)

    thoughts = count("thoughtsTokenCount")
    return Usage(
        prompt_tokens=count("promptTokenCount", default=None),
        completion_tokens=count("candidatesTokenCount") + thoughts,
        cached_tokens=count("cachedContentTokenCount"),
        reasoning_tokens=thoughts,
    )


async def read_stream(
    events: AsyncIterator[ServerSentEvent], provider: str, model: str, secret: str | None = None
) -> AsyncIterator[StreamEvent]:
    """Translate ``alt=sse`` chunks into TextDelta events and one StreamEnd.

    Gemini sends no end marker: the last chunk's candidate carries ``finishReason`` and usage.
    A stream that closes without a finish reason was cut and yields no StreamEnd. ``secret``
    (the key) is masked in any error text the stream quotes.
    """
    usage: Usage | None = None
    finish_reason: str | None = None
    answered = False
    async for event in events:
        if not event.data.strip():
            continue
        try:
            chunk = _read_chunk(_decode(event.data), model)
            usage, model = chunk.usage or usage, chunk.model
            answered = answered or any(chunk.texts)
            finish_reason = chunk.finish_reason or finish_reason
            if finish_reason is not None:
                _check_withheld(finish_reason, answered=answered)
        except WorkerError as exc:
            raise _labelled(exc, provider, secret) from exc
        for text in chunk.texts:
            if text:
                yield TextDelta(text)
    if finish_reason is None:
        return  # cut before the end: collect_stream raises StreamInterrupted
    if usage is None:
        raise MalformedResponse(f"{provider}: the stream ended without usageMetadata")
    yield StreamEnd(usage=usage, finish_reason=finish_reason, model=model)


@dataclass(frozen=True)
class _Chunk:
    """What one response (or stream chunk) says: answer text pieces (thoughts left out), the
    function calls asked for, the finish reason, usage and model."""

    texts: list[str]
    calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    model: str


def _read_chunk(chunk: dict[str, Any], model: str) -> _Chunk:
    """No candidates is no text, unless the prompt was blocked."""
    raw_usage = chunk.get("usageMetadata")
    usage = None if raw_usage is None else parse_usage(raw_usage)
    model = _model_version(chunk) or model
    candidates = chunk.get("candidates")
    if not candidates:
        _check_prompt_feedback(chunk)
        return _Chunk([], (), None, usage, model)
    if not isinstance(candidates, list):
        raise MalformedResponse(f"'candidates' must be a list, got {kind(candidates)}")
    texts, raw_calls, finish_reason = _read_candidate(candidates[0])
    calls = _tool_calls(raw_calls, chunk.get("responseId"))
    return _Chunk(texts, calls, finish_reason, usage, model)


def _decode(data: str) -> dict[str, Any]:
    chunk = json_event(data)
    if "error" in chunk:
        raise _stream_error(chunk)
    return chunk


def _stream_error(chunk: dict[str, Any]) -> WorkerError:
    """An error sent after the 200, inside the stream: classed by its status as HTTP would be."""
    error = chunk.get("error")
    status = error.get("status") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    status_code = code if isinstance(code, int) and not isinstance(code, bool) else None
    message = f"error inside the stream: {error_detail(chunk)}"
    if status == "RESOURCE_EXHAUSTED":
        # No headers inside a stream: the body's RetryInfo is the only hint of how long to wait.
        wait = retry_after_s(httpx.Response(429), chunk)
        return RateLimited(message, status_code=status_code, retry_after_s=wait)
    if status in RETRYABLE_STATUSES:
        return ProviderUnavailable(message, status_code=status_code)
    return MalformedResponse(message, status_code=status_code)


def _read_candidate(raw: Any) -> tuple[list[str], list[tuple[str, Any]], str | None]:
    """The candidate's answer text pieces (thoughts left out), its functionCall objects (each
    with where it is, for errors) and its finish reason."""
    candidate = json_object(raw, "candidates[0]")
    finish_reason = candidate.get("finishReason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise MalformedResponse(f"finishReason must be a string, got {kind(finish_reason)}")
    content = json_object(candidate.get("content") or {}, "candidates[0].content")
    parts = content.get("parts") or []
    if not isinstance(parts, list):
        raise MalformedResponse(f"candidates[0].content.parts must be a list, got {kind(parts)}")
    texts: list[str] = []
    calls: list[tuple[str, Any]] = []
    for i, raw_part in enumerate(parts):
        part = json_object(raw_part, "candidates[0].content.parts[]")
        text = part.get("text")
        if text is not None and not isinstance(text, str):
            raise MalformedResponse(f"a part's text must be a string, got {kind(text)}")
        if text is not None and part.get("thought") is not True:
            texts.append(text)
        if "functionCall" in part:
            calls.append((f"candidates[0].content.parts[{i}].functionCall", part["functionCall"]))
    return texts, calls, finish_reason


def _tool_calls(raw_calls: list[tuple[str, Any]], response_id: Any) -> tuple[ToolCall, ...]:
    """The functionCall objects as ToolCalls. A call without Gemini's optional ``id`` gets one
    from the response's id and its place, unique across turns, as clients expect ids to be."""
    prefix = f"call_{response_id}_" if isinstance(response_id, str) and response_id else "call_"
    return tuple(_tool_call(raw, where, f"{prefix}{n}") for n, (where, raw) in enumerate(raw_calls))


def _tool_call(raw: Any, where: str, default_id: str) -> ToolCall:
    call = json_object(raw, where)
    name, args, ident = call.get("name"), call.get("args", {}), call.get("id")
    if not isinstance(name, str) or not name:
        raise MalformedResponse(f"{where}.name must be a non-empty string, got {kind(name)}")
    if args is None:
        args = {}  # a function without parameters
    if not isinstance(args, dict):
        raise MalformedResponse(f"{where}.args must be an object, got {kind(args)}")
    if ident is not None and not isinstance(ident, str):
        raise MalformedResponse(f"{where}.id must be a string, got {kind(ident)}")
    arguments = json.dumps(args, ensure_ascii=False)  # as the model wrote them, not \u-escaped
    try:
        return ToolCall(id=ident or default_id, name=name, arguments=arguments)
    except ValidationError as exc:  # an id or name past ToolCall's bounds
        raise MalformedResponse(f"{where}: {exc.errors()[0]['msg']}") from None


def _check_prompt_feedback(response: dict[str, Any]) -> None:
    feedback = response.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if reason is not None:
        raise ProviderRejected(
            f"Gemini blocked the prompt ({reason}); the same prompt will be blocked again"
        )


def _check_withheld(finish_reason: str | None, *, answered: bool) -> None:
    """``answered``: the model gave text or function calls."""
    if finish_reason in BOTCHED_CALL:
        raise MalformedResponse(
            f"Gemini's function call was unusable (finishReason {finish_reason}); another "
            "try may make a whole one"
        )
    if finish_reason is not None and finish_reason not in ANSWERED and not answered:
        raise ProviderRejected(
            f"Gemini withheld the answer (finishReason {finish_reason}); retrying will not help"
        )


def _labelled(exc: WorkerError, provider: str, secret: str | None) -> WorkerError:
    """The same error named after the worker, with the key masked in any text it quotes; the
    HTTP status was 200 unless the error object inside a stream named another."""
    message = f"{provider}: {exc}"
    if secret:
        message = message.replace(secret, "***")
    status = 200 if exc.status_code is None else exc.status_code
    return type(exc)(message, status_code=status, retry_after_s=exc.retry_after_s)


def _model_version(body: Mapping[str, Any]) -> str:
    version = body.get("modelVersion", "")
    if not isinstance(version, str):
        raise MalformedResponse(f"'modelVersion' must be a string, got {kind(version)}")
    return version


class GeminiWorker(HttpWorker):
    """A ChatWorker (and ToolCallingWorker, FormattedAnswerWorker) that POSTs
    ``{base_url}/v1beta/models/{model}:generateContent``."""

    providers = frozenset({Provider.GEMINI})
    wire_format = "Gemini wire format"

    def configure(self, base_url: str, api_key: str | None) -> None:
        path = self.model if self.model.startswith("models/") else f"models/{self.model}"
        self.url = f"{base_url}/{API_VERSION}/{path}"
        self._api_key = api_key
        self._headers = {"x-goog-api-key": api_key} if api_key else {}

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        return await self._generate(self._payload(messages, max_tokens, temperature))

    async def complete_with_tools(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolUse,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        return await self._generate(self._payload(messages, max_tokens, temperature, tools))

    async def complete_in_format(
        self,
        messages: Sequence[ChatMessage],
        answer_format: AnswerFormat,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """One whole call whose answer Gemini constrains to JSON (and to the schema, if any)."""
        payload = self._payload(messages, max_tokens, temperature, answer_format=answer_format)
        return await self._generate(payload)

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        payload = self._payload(messages, max_tokens, temperature)
        url = f"{self.url}:streamGenerateContent?alt=sse"
        events = stream_sse(
            self._client, url, self._headers, payload, self.timeout_s, self.provider
        )
        return read_stream(events, self.provider, self.model, self._api_key)

    def _payload(
        self,
        messages: Sequence[ChatMessage],
        max_tokens: int,
        temperature: float,
        tools: ToolUse | None = None,
        *,
        answer_format: AnswerFormat | None = None,
    ) -> dict[str, Any]:
        """The request body; a history Gemini cannot take is refused naming this worker, with
        no HTTP status: nothing was sent."""
        try:
            return build_request(
                messages,
                max_tokens,
                temperature,
                tools,
                fetches_urls=_fetches_urls(self.model),
                answer_format=answer_format,
            )
        except ProviderRejected as exc:
            raise ProviderRejected(f"{self.provider}: {exc}") from exc

    async def _generate(self, payload: dict[str, Any]) -> Completion:
        url = f"{self.url}:generateContent"
        body = await post_json(
            self._client, url, self._headers, payload, self.timeout_s, self.provider
        )
        try:
            return parse_response(body, self.model)
        except WorkerError as exc:
            raise _labelled(exc, self.provider, self._api_key) from exc
