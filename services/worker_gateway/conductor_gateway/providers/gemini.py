"""Worker adapter for Google's Gemini API: ``generateContent`` and ``streamGenerateContent``.

Wire format: https://ai.google.dev/api/generate-content (bodies, usage, finish reasons) and
https://ai.google.dev/gemini-api/docs/troubleshooting (error statuses). The key travels in the
``x-goog-api-key`` header, never in the URL, so it cannot leak into logs of URLs. Like every
adapter, this makes exactly one HTTP call per ``complete`` or ``stream``; retries, quotas and
cost accounting belong to the gateway around it.

Usage mapping: Gemini bills thinking tokens (``thoughtsTokenCount``) as output but reports them
apart from ``candidatesTokenCount``, so ``completion_tokens`` is their sum and
``reasoning_tokens`` the thoughts alone; ``promptTokenCount`` already includes the cached part.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
from httpx_sse import ServerSentEvent

from conductor.chat import ChatMessage, Completion, Usage
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
from conductor_gateway.providers.turns import system_and_turns

API_VERSION = "v1beta"
ROLES = {"user": "user", "assistant": "model"}
# Finish reasons of an answer the model completed (or ran out of room for); any other reason
# with no text means Google withheld the answer (SAFETY, RECITATION, PROHIBITED_CONTENT, ...).
ANSWERED = frozenset({"STOP", "MAX_TOKENS"})
# In-stream error statuses worth another try, as their HTTP twins (429, 500, 503, 504) are.
RETRYABLE_STATUSES = frozenset({"UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"})


def build_request(
    messages: Sequence[ChatMessage], max_tokens: int, temperature: float
) -> dict[str, Any]:
    """The JSON body of ``generateContent``: system text apart, assistant turns as "model".

    Consecutive turns of one role are merged, since Gemini expects the roles to alternate.
    """
    system, turns = system_and_turns(messages)
    contents = [{"role": ROLES[role], "parts": [{"text": text}]} for role, text in turns]
    payload: dict[str, Any] = {
        "contents": contents,
        "generationConfig": {"maxOutputTokens": max_tokens, "temperature": temperature},
    }
    if system is not None:
        payload["systemInstruction"] = {"parts": [{"text": system}]}
    return payload


def parse_response(body: Any, model: str) -> Completion:
    """Read a GenerateContentResponse; off-format is MalformedResponse, never KeyError.

    A withheld answer (blocked prompt or candidate) is ProviderRejected: asking again gets the
    same verdict. ``model`` names the answer when the body carries no ``modelVersion``.
    """
    response = json_object(body, "response")
    if "error" in response and "candidates" not in response:
        raise MalformedResponse(f"2xx response carries an error: {error_detail(response)}")
    texts, finish_reason, usage, model = _read_chunk(response, model)
    if not response.get("candidates"):
        got = kind(response.get("candidates"))
        raise MalformedResponse(f"'candidates' must be a non-empty list, got {got}")
    if usage is None:
        raise MalformedResponse("usageMetadata must be an object, got null")
    text = "".join(texts)
    _check_withheld(finish_reason, has_text=bool(text))
    return Completion(text=text, usage=usage, model=model, finish_reason=finish_reason)


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
            texts, finish, chunk_usage, model = _read_chunk(_decode(event.data), model)
            usage = chunk_usage or usage
            answered = answered or any(texts)
            finish_reason = finish or finish_reason
            if finish_reason is not None:
                _check_withheld(finish_reason, has_text=answered)
        except WorkerError as exc:
            raise _labelled(exc, provider, secret) from exc
        for text in texts:
            if text:
                yield TextDelta(text)
    if finish_reason is None:
        return  # cut before the end: collect_stream raises StreamInterrupted
    if usage is None:
        raise MalformedResponse(f"{provider}: the stream ended without usageMetadata")
    yield StreamEnd(usage=usage, finish_reason=finish_reason, model=model)


def _read_chunk(
    chunk: dict[str, Any], model: str
) -> tuple[list[str], str | None, Usage | None, str]:
    """A response's (or stream chunk's) text pieces, finish reason, usage and model; no
    candidates is no text, unless the prompt was blocked."""
    raw_usage = chunk.get("usageMetadata")
    usage = None if raw_usage is None else parse_usage(raw_usage)
    model = _model_version(chunk) or model
    candidates = chunk.get("candidates")
    if not candidates:
        _check_prompt_feedback(chunk)
        return [], None, usage, model
    if not isinstance(candidates, list):
        raise MalformedResponse(f"'candidates' must be a list, got {kind(candidates)}")
    texts, finish_reason = _read_candidate(candidates[0])
    return texts, finish_reason, usage, model


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


def _read_candidate(raw: Any) -> tuple[list[str], str | None]:
    """The candidate's answer text pieces (thoughts left out) and its finish reason."""
    candidate = json_object(raw, "candidates[0]")
    finish_reason = candidate.get("finishReason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise MalformedResponse(f"finishReason must be a string, got {kind(finish_reason)}")
    content = json_object(candidate.get("content") or {}, "candidates[0].content")
    parts = content.get("parts") or []
    if not isinstance(parts, list):
        raise MalformedResponse(f"candidates[0].content.parts must be a list, got {kind(parts)}")
    texts: list[str] = []
    for raw_part in parts:
        part = json_object(raw_part, "candidates[0].content.parts[]")
        text = part.get("text")
        if text is not None and not isinstance(text, str):
            raise MalformedResponse(f"a part's text must be a string, got {kind(text)}")
        if text is not None and part.get("thought") is not True:
            texts.append(text)
    return texts, finish_reason


def _check_prompt_feedback(response: dict[str, Any]) -> None:
    feedback = response.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if reason is not None:
        raise ProviderRejected(
            f"Gemini blocked the prompt ({reason}); the same prompt will be blocked again"
        )


def _check_withheld(finish_reason: str | None, *, has_text: bool) -> None:
    if finish_reason is not None and finish_reason not in ANSWERED and not has_text:
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
    """A ChatWorker that POSTs ``{base_url}/v1beta/models/{model}:generateContent``."""

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
        payload = build_request(messages, max_tokens, temperature)
        url = f"{self.url}:generateContent"
        body = await post_json(
            self._client, url, self._headers, payload, self.timeout_s, self.provider
        )
        try:
            return parse_response(body, self.model)
        except WorkerError as exc:
            raise _labelled(exc, self.provider, self._api_key) from exc

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        payload = build_request(messages, max_tokens, temperature)
        url = f"{self.url}:streamGenerateContent?alt=sse"
        events = stream_sse(
            self._client, url, self._headers, payload, self.timeout_s, self.provider
        )
        return read_stream(events, self.provider, self.model, self._api_key)
