"""A fake Google Gemini API server that speaks the documented generateContent wire format.

Bodies follow https://ai.google.dev/api/generate-content (GenerateContentResponse: candidates
with content parts and finishReason, usageMetadata, modelVersion, responseId); errors use
Google's error object ``{"error": {"code", "message", "status", "details"}}`` as listed in
https://ai.google.dev/gemini-api/docs/troubleshooting. Streams follow ``alt=sse``: one
``data: {chunk}`` event per piece, no end marker, the last chunk carrying finishReason.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from fakes.http_server import RecordedRequest, ScriptedResponse, ScriptedServer

MODEL_VERSION = "gemini-2.5-flash-fake"
_ROUTE = re.compile(
    r"^/v1beta/models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent)$"
)
_ids = itertools.count(1)


def count_tokens(text: str) -> int:
    """The fake's tokenizer: about four characters a token, as in the OpenAI fake."""
    return math.ceil(len(text) / 4)


def usage_metadata(
    *,
    prompt_tokens: int = 10,
    candidates_tokens: int | None = 5,
    cached_tokens: int | None = None,
    thoughts_tokens: int | None = None,
) -> dict[str, Any]:
    """usageMetadata as Gemini sends it: a count passed as None is left out, as Gemini leaves
    out zero counts (no thinking, no cache hit, nothing generated yet)."""
    usage: dict[str, Any] = {"promptTokenCount": prompt_tokens}
    if candidates_tokens is not None:
        usage["candidatesTokenCount"] = candidates_tokens
    if cached_tokens is not None:
        usage["cachedContentTokenCount"] = cached_tokens
    if thoughts_tokens is not None:
        usage["thoughtsTokenCount"] = thoughts_tokens
    usage["totalTokenCount"] = prompt_tokens + (candidates_tokens or 0) + (thoughts_tokens or 0)
    return usage


def response_body(
    text: str | None,
    *,
    finish_reason: str | None = "STOP",
    thought: str | None = None,
    model_version: str | None = MODEL_VERSION,
    **usage: Any,
) -> dict[str, Any]:
    """A GenerateContentResponse; ``thought`` adds a thought summary part before the answer,
    ``text=None`` a candidate without parts; ``usage`` goes to ``usage_metadata``."""
    parts: list[dict[str, Any]] = []
    if thought is not None:
        parts.append({"text": thought, "thought": True})
    if text is not None:
        parts.append({"text": text})
    content: dict[str, Any] = {"role": "model"}
    if parts:
        content["parts"] = parts
    candidate: dict[str, Any] = {"content": content, "index": 0}
    if finish_reason is not None:
        candidate["finishReason"] = finish_reason
    body: dict[str, Any] = {
        "candidates": [candidate],
        "usageMetadata": usage_metadata(**usage),
        "responseId": f"fake-response-{next(_ids)}",
    }
    if model_version is not None:
        body["modelVersion"] = model_version
    return body


def blocked_body(reason: str = "SAFETY", prompt_tokens: int = 8) -> dict[str, Any]:
    """The answer to a blocked prompt: no candidates, only promptFeedback."""
    return {
        "promptFeedback": {"blockReason": reason},
        "usageMetadata": {"promptTokenCount": prompt_tokens, "totalTokenCount": prompt_tokens},
        "modelVersion": MODEL_VERSION,
    }


def error_body(
    status: int, status_name: str, message: str, retry_delay: str | None = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"code": status, "message": message, "status": status_name}
    if retry_delay is not None:
        error["details"] = [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}
        ]
    return {"error": error}


def generated(text: str | None, *, delay_s: float = 0.0, **fields: Any) -> ScriptedResponse:
    """A scripted 200; ``fields`` go to ``response_body`` (finish reason, thought, usage)."""
    return ScriptedResponse(json=response_body(text, **fields), delay_s=delay_s)


def error(
    status: int,
    status_name: str,
    message: str,
    retry_delay: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ScriptedResponse:
    """A scripted error carrying Google's error object (RetryInfo when ``retry_delay``)."""
    return ScriptedResponse(
        status=status,
        json=error_body(status, status_name, message, retry_delay),
        headers=dict(headers or {}),
    )


def sse(chunk: Mapping[str, Any]) -> str:
    """One event as Gemini frames it (CRLF line ends)."""
    return f"data: {json.dumps(chunk)}\r\n\r\n"


def stream_events(
    text: str,
    *,
    pieces: int = 3,
    with_finish: bool = True,
    finish_reason: str = "STOP",
    model_version: str = MODEL_VERSION,
    prompt_tokens: int = 10,
    candidates_tokens: int | None = None,
    **usage: Any,
) -> list[str]:
    """``alt=sse`` chunks: each carries a text piece and running usage (prompt only); the last
    carries finishReason and the full usage. ``with_finish=False`` leaves the finish out."""
    size = max(1, math.ceil(len(text) / pieces))
    texts = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    running = usage_metadata(prompt_tokens=prompt_tokens, candidates_tokens=None)
    final = usage_metadata(
        prompt_tokens=prompt_tokens,
        candidates_tokens=count_tokens(text) if candidates_tokens is None else candidates_tokens,
        **usage,
    )
    response_id = f"fake-response-{next(_ids)}"
    events = []
    for number, piece in enumerate(texts, 1):
        last = number == len(texts)
        finish = finish_reason if last and with_finish else None
        chunk = response_body(piece, finish_reason=finish, model_version=model_version)
        chunk |= {"responseId": response_id, "usageMetadata": final if last else running}
        events.append(sse(chunk))
    return events


def streamed(text: str, *, cut_after: int | None = None, **fields: Any) -> ScriptedResponse:
    """A scripted 200 event stream; ``cut_after`` drops the connection after that many events."""
    return ScriptedResponse(events=stream_events(text, **fields), cut_after=cut_after)


def content_text(content: Any) -> str:
    """The text of a request's Content object; "" for anything else."""
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return ""
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


class FakeGeminiServer(ScriptedServer):
    """Answers generateContent and streamGenerateContent with ``echo: <last user text>``
    unless a script is queued.

    Requests are checked as Google checks them: a missing ``x-goog-api-key`` is 403
    PERMISSION_DENIED, a body without a ``contents`` list 400 INVALID_ARGUMENT, an unknown route
    404 NOT_FOUND. Usage counts about four characters a token plus four per content.
    ``latency_s`` delays every default answer.
    """

    def __init__(self, latency_s: float = 0.0) -> None:
        super().__init__()
        self.latency_s = latency_s

    @property
    def base_url(self) -> str:
        return self.url

    def default_response(self, request: RecordedRequest) -> ScriptedResponse:
        route = _ROUTE.match(request.path)
        if route is None:
            return error(404, "NOT_FOUND", f"Invalid URL ({request.method} {request.path})")
        if request.method != "POST":
            return error(405, "METHOD_NOT_ALLOWED", f"{request.method} not allowed")
        if not request.headers.get("x-goog-api-key"):
            return error(
                403,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to call "
                "this API.",
            )
        body = request.json
        if not isinstance(body, dict) or not isinstance(body.get("contents"), list):
            return error(400, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: required")
        contents: list[Any] = body["contents"]
        last_user = next(
            (c for c in reversed(contents) if isinstance(c, dict) and c.get("role") == "user"),
            None,
        )
        answer = f"echo: {content_text(last_user)}"
        prompt = sum(count_tokens(content_text(c)) + 4 for c in contents)
        if "systemInstruction" in body:
            prompt += count_tokens(content_text(body["systemInstruction"])) + 4
        model = route["model"]
        if route["method"] == "streamGenerateContent":
            events = stream_events(
                answer,
                model_version=model,
                prompt_tokens=prompt,
                candidates_tokens=count_tokens(answer),
            )
            return ScriptedResponse(events=events, delay_s=self.latency_s)
        return generated(
            answer,
            model_version=model,
            delay_s=self.latency_s,
            prompt_tokens=prompt,
            candidates_tokens=count_tokens(answer),
        )
