"""HTTP plumbing every provider adapter shares: one JSON call, one SSE stream, one error mapping.

OpenAI, Anthropic and Gemini differ in bodies, not in how failures look on the wire, so the
mapping of a failed call onto the typed exception tree lives here once. The gateway's retry
policy keys on the classes raised (``retryable``, ``retry_after_s``); nothing here retries.

Secrets: keys travel only in request headers. Error text quoted from a provider has any key the
request carried replaced by ``***`` (some proxies echo request headers in their error pages).
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import json
import math
import re
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, SSEError, aconnect_sse

from conductor.errors import (
    MalformedResponse,
    ProviderAuthError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    QuotaExhausted,
    RateLimited,
    StreamInterrupted,
)
from conductor_adapters.aiohttp_transport import AiohttpTransport

MAX_DETAIL_CHARS = 300  # provider text quoted in an error message; enough to act on, no page dumps
SECRET_HEADERS = ("authorization", "api-key", "x-api-key", "x-goog-api-key")


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context per process, shared by every connection pool: building one loads the CA
    bundle (0.1 s here), and each pool building its own made every provider client cost ~2 s.
    It is httpx's default context, so SSL_CERT_FILE and SSL_CERT_DIR apply as usual."""
    return httpx.create_ssl_context()


def new_client() -> httpx.AsyncClient:
    """An AsyncClient for provider calls, sent by aiohttp (see ``aiohttp_transport``). Nothing
    retries by itself (the gateway does)."""
    return httpx.AsyncClient(transport=AiohttpTransport(tls_context()))


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str],
    payload: Mapping[str, Any],
    timeout_s: float,
    provider: str,
) -> Any:
    """POST a JSON body and return the decoded 2xx JSON; every failure is a WorkerError.

    ``timeout_s`` bounds the whole call (connect, send, wait, read), not each phase alone, so a
    server that trickles bytes cannot hold a call past its deadline.
    """
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post(
                url, headers=dict(headers), json=payload, timeout=timeout_s
            )
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise ProviderTimeout(f"{provider}: no complete answer within {timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        raise _transport_error(exc, provider, url) from exc
    raise_for_status(response, provider)
    try:
        return response.json()
    except ValueError as exc:
        snippet = redact(truncate(response.text), response)
        raise MalformedResponse(
            f"{provider}: HTTP {response.status_code} body is not JSON "
            f"(content-type {response.headers.get('content-type', 'none')!r}): {snippet!r}",
            status_code=response.status_code,
        ) from exc


async def stream_sse(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str],
    payload: Mapping[str, Any],
    timeout_s: float,
    provider: str,
) -> AsyncIterator[ServerSentEvent]:
    """POST a JSON body and yield the server-sent events of a 2xx answer.

    ``timeout_s`` bounds connecting and each silence between chunks; the caller bounds the whole
    stream. A connection that breaks mid-stream is StreamInterrupted (retryable): the text so far
    is never passed off as an answer. Whether the stream reached its end marker is the vendor
    adapter's to judge, since each vendor marks the end differently.
    """
    try:
        async with aconnect_sse(
            client, "POST", url, headers=dict(headers), json=payload, timeout=timeout_s
        ) as source:
            response = source.response
            if not 200 <= response.status_code < 300:
                await response.aread()
                raise_for_status(response, provider)
            async for event in source.aiter_sse():
                yield event
    except httpx.TimeoutException as exc:
        raise ProviderTimeout(f"{provider}: stream silent for {timeout_s:g} s") from exc
    except SSEError as exc:
        raise MalformedResponse(f"{provider}: not an event stream: {exc}") from exc
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        raise StreamInterrupted(f"{provider}: the stream broke off: {describe(exc)}") from exc
    except httpx.HTTPError as exc:
        raise _transport_error(exc, provider, url) from exc


def raise_for_status(response: httpx.Response, provider: str) -> None:
    """Map a non-2xx answer onto the exception tree; the retry policy keys on the class."""
    status = response.status_code
    if 200 <= status < 300:
        return
    body = _json_or_none(response)
    detail = redact(error_detail(body) if body is not None else _text_detail(response), response)
    message = f"{provider}: HTTP {status}" + (f": {detail}" if detail else "")
    wait = retry_after_s(response, body)
    if status == 429:
        if _error_code(body) == "insufficient_quota":
            raise QuotaExhausted(
                f"{message} (the account is out of quota or credit; retrying will not help)",
                status_code=status,
            )
        raise RateLimited(message, status_code=status, retry_after_s=wait)
    if status in (401, 403):
        raise ProviderAuthError(
            f"{message} (check the API key and its permissions)", status_code=status
        )
    if status in (408, 409) or status >= 500:
        raise ProviderUnavailable(message, status_code=status, retry_after_s=wait)
    # Other 4xx (400, 404, 413, 422, ...) and unexpected 1xx/3xx: the request itself is wrong.
    raise ProviderRejected(message, status_code=status)


def retry_after_s(response: httpx.Response, body: Any = None) -> float | None:
    """Seconds the provider asks us to wait: ``retry-after-ms``, ``Retry-After`` (seconds or an
    HTTP date), else Google's ``RetryInfo.retryDelay`` ("1.5s") in the error body."""
    millis = _non_negative(response.headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = response.headers.get("retry-after")
    if value is not None:
        seconds = _non_negative(value)
        if seconds is not None:
            return seconds
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            return max(0.0, when.timestamp() - time.time())
    return _google_retry_delay(body)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


def _google_retry_delay(body: Any) -> float | None:
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            match = _DURATION.match(str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


def error_detail(body: Any) -> str:
    """The vendor error object's message plus its code, or the body itself when it has none.

    OpenAI ``{"error": {"message", "code"|"type"}}``, Anthropic ``{"type": "error", "error":
    {"type", "message"}}`` and Google ``{"error": {"code", "message", "status"}}`` all fit.
    """
    if not isinstance(body, dict):
        return truncate(str(body))
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = _error_code(body)
        suffix = f" [{code}]" if code else ""
        return truncate(error["message"]) + suffix
    if isinstance(error, str):
        return truncate(error)
    return truncate(str(dict(body)))


def _error_code(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    for key in ("code", "status", "type"):
        value = error.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def redact(text: str, response: httpx.Response) -> str:
    try:
        request_headers = response.request.headers
    except RuntimeError:  # a Response built by hand has no request
        return text
    for header in SECRET_HEADERS:
        value = request_headers.get(header)
        if not value:
            continue
        secret = value.split(" ", 1)[1] if value.lower().startswith("bearer ") else value
        if secret.strip():
            text = text.replace(secret.strip(), "***")
    return text


def truncate(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def kind(value: Any) -> str:
    """A JSON value's type as error messages name it."""
    return "null" if value is None else type(value).__name__


def json_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedResponse(f"{where} must be an object, got {kind(value)}")
    return value


def json_event(data: str) -> dict[str, Any]:
    """One server-sent event's data as a JSON object; anything else is MalformedResponse."""
    try:
        decoded = json.loads(data)
    except ValueError as exc:
        raise MalformedResponse(f"stream chunk is not JSON: {truncate(data)!r}") from exc
    return json_object(decoded, "stream chunk")


def token_count(value: Any, where: str, *, default: int | None = None) -> int:
    """A usage counter: a non-negative integer, or ``default`` when absent and one is given."""
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedResponse(f"{where} must be a non-negative integer, got {value!r}")
    return value


def _transport_error(exc: httpx.HTTPError, provider: str, url: str) -> Exception:
    if isinstance(exc, httpx.UnsupportedProtocol):
        return ProviderRejected(f"{provider}: bad URL {url!r}: {exc}")
    if isinstance(exc, httpx.DecodingError):
        return MalformedResponse(f"{provider}: undecodable response body: {exc}")
    return ProviderUnavailable(f"{provider}: cannot reach {url}: {describe(exc)}")


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _text_detail(response: httpx.Response) -> str:
    return truncate(" ".join(response.text.split()))


def _non_negative(value: str | None) -> float | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None
