"""The OpenAI Chat Completions wire format, shared by the worker gateway and the planner.

Both services speak to OpenAI-compatible endpoints (api.openai.com, vLLM, llama.cpp), so the
request body, the response parser and the mapping of failures onto the typed exception tree live
here, once. This module never retries: the gateway owns the retry policy and keys it on the
exception classes raised here (``retryable``, ``RateLimited.retry_after_s``).

Secrets: the API key travels only in request headers. Error messages quote the provider's own
text, with any bearer token or ``api-key`` the request carried replaced by ``***``.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import (
    MalformedResponse,
    ProviderAuthError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
)

MAX_DETAIL_CHARS = 300  # provider text quoted in an error message; enough to act on, no page dumps


def build_chat_request(
    model: str,
    messages: Sequence[ChatMessage],
    max_tokens: int,
    temperature: float,
    response_format: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` (non-streaming)."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if response_format is not None:
        payload["response_format"] = dict(response_format)
    return payload


def parse_chat_response(body: Any) -> Completion:
    """Read a chat.completion object; anything off-format is MalformedResponse, never KeyError."""
    if not isinstance(body, dict):
        raise MalformedResponse(f"expected a JSON object, got {_kind(body)}")
    if "error" in body and "choices" not in body:
        raise MalformedResponse(f"2xx response carries an error: {_error_detail(body)}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"'choices' must be a non-empty list, got {_kind(choices)}")
    choice = _object(choices[0], "choices[0]")
    message = _object(choice.get("message"), "choices[0].message")
    content = message.get("content")
    if not isinstance(content, str):
        refusal = message.get("refusal")
        why = f" (the model refused: {_truncate(refusal)})" if isinstance(refusal, str) else ""
        raise MalformedResponse(
            f"choices[0].message.content must be a string, got {_kind(content)}{why}"
        )
    finish_reason = choice.get("finish_reason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise MalformedResponse(
            f"choices[0].finish_reason must be a string, got {_kind(finish_reason)}"
        )
    model = body.get("model", "")
    if not isinstance(model, str):
        raise MalformedResponse(f"'model' must be a string, got {_kind(model)}")
    return Completion(
        text=content,
        usage=_parse_usage(body.get("usage")),
        model=model,
        finish_reason=finish_reason,
    )


def _parse_usage(raw: Any) -> Usage:
    # Usage is required: cost accounting and token quotas depend on it.
    usage = _object(raw, "usage")
    details = usage.get("prompt_tokens_details")
    cached: Any = 0
    if details is not None:
        cached = _object(details, "usage.prompt_tokens_details").get("cached_tokens") or 0
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
        completion_tokens=_count(usage.get("completion_tokens"), "usage.completion_tokens"),
        cached_tokens=_count(cached, "usage.prompt_tokens_details.cached_tokens"),
    )


def raise_for_status(response: httpx.Response, provider: str) -> None:
    """Map a non-2xx answer onto the exception tree; the retry policy keys on the class."""
    status = response.status_code
    if 200 <= status < 300:
        return
    detail = _redact(_response_detail(response), response)
    message = f"{provider}: HTTP {status}" + (f": {detail}" if detail else "")
    if status == 429:
        raise RateLimited(message, status_code=status, retry_after_s=retry_after_s(response))
    if status in (401, 403):
        raise ProviderAuthError(
            f"{message} (check the API key and its permissions)", status_code=status
        )
    if status in (408, 409) or status >= 500:
        raise ProviderUnavailable(message, status_code=status)
    # Other 4xx (400, 404, 413, 422, ...) and unexpected 1xx/3xx: the request itself is wrong.
    raise ProviderRejected(message, status_code=status)


def retry_after_s(response: httpx.Response) -> float | None:
    """Seconds the provider asks us to wait: ``retry-after-ms``, else ``Retry-After``."""
    millis = _non_negative(response.headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = response.headers.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def post_chat(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str],
    payload: Mapping[str, Any],
    timeout_s: float,
    *,
    provider: str | None = None,
) -> Completion:
    """One Chat Completions call, every failure raised as a WorkerError subclass.

    ``timeout_s`` bounds the whole call (connect, send, wait, read), not each phase alone, so a
    server that trickles bytes cannot hold a worker past its deadline.
    """
    name = provider or httpx.URL(url).host or url
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post(
                url, headers=dict(headers), json=payload, timeout=timeout_s
            )
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise ProviderTimeout(f"{name}: no complete answer within {timeout_s:g} s") from exc
    except httpx.UnsupportedProtocol as exc:
        raise ProviderRejected(f"{name}: bad URL {url!r}: {exc}") from exc
    except httpx.TransportError as exc:
        raise ProviderUnavailable(f"{name}: cannot reach {url}: {_describe(exc)}") from exc
    except httpx.DecodingError as exc:
        raise MalformedResponse(f"{name}: undecodable response body: {exc}") from exc
    raise_for_status(response, name)
    try:
        body = response.json()
    except ValueError as exc:
        snippet = _redact(_truncate(response.text), response)
        raise MalformedResponse(
            f"{name}: HTTP {response.status_code} body is not JSON "
            f"(content-type {response.headers.get('content-type', 'none')!r}): {snippet!r}",
            status_code=response.status_code,
        ) from exc
    try:
        return parse_chat_response(body)
    except MalformedResponse as exc:
        raise MalformedResponse(f"{name}: {exc}", status_code=response.status_code) from exc


# No hidden cap on connections: the gateway's concurrency quota decides how many calls are in
# flight, and a pool limit here would surface as spurious PoolTimeouts under load.
DEFAULT_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=100)


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
    ) -> None:
        self.model = model
        self.timeout_s = timeout_s
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.provider = provider
        self._headers = auth_headers(api_key)
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(limits=DEFAULT_LIMITS)

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float,
        response_format: Mapping[str, Any] | None = None,
    ) -> Completion:
        payload = build_chat_request(
            self.model, messages, max_tokens, temperature, response_format=response_format
        )
        return await post_chat(
            self._client, self.url, self._headers, payload, self.timeout_s, provider=self.provider
        )

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it; a borrowed one is its owner's."""
        if self._owns_client:
            await self._client.aclose()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"OpenAIChatClient(model={self.model!r}, url={self.url!r})"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer`` when a key is set; keyless local servers get no header at all."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _response_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return _truncate(" ".join(response.text.split()))
    return _error_detail(body) if isinstance(body, dict) else _truncate(str(body))


def _error_detail(body: Mapping[str, Any]) -> str:
    """The OpenAI error object's message (plus its code), or the body itself when it has none."""
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = error.get("code") or error.get("type")
        suffix = f" [{code}]" if isinstance(code, str) and code else ""
        return _truncate(error["message"]) + suffix
    if isinstance(error, str):
        return _truncate(error)
    return _truncate(str(dict(body)))


def _redact(text: str, response: httpx.Response) -> str:
    # Some proxies echo request headers in their error pages; never let a key reach a message.
    try:
        request_headers = response.request.headers
    except RuntimeError:  # a Response built by hand has no request
        return text
    for header in ("authorization", "api-key", "x-api-key"):
        value = request_headers.get(header)
        if not value:
            continue
        secret = value.split(" ", 1)[1] if value.lower().startswith("bearer ") else value
        if secret.strip():
            text = text.replace(secret.strip(), "***")
    return text


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedResponse(f"{where} must be an object, got {_kind(value)}")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedResponse(f"{where} must be a non-negative integer, got {value!r}")
    return value


def _non_negative(value: str | None) -> float | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
