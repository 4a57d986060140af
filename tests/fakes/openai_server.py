"""A fake OpenAI Chat Completions server that speaks the documented wire format.

Bodies follow https://platform.openai.com/docs/api-reference/chat/object (id, object, created,
model, choices, usage with prompt_tokens_details.cached_tokens); errors use the OpenAI error
object ``{"error": {"message", "type", "param", "code"}}``. Routes live under ``/v1`` like the
real API, so adapters are pointed at ``base_url``.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from conductor.pool import Price, Provider, WorkerSpec

from fakes.http_server import RecordedRequest, ScriptedResponse, ScriptedServer

Responder = Callable[[list[dict[str, Any]]], str]
CHAT_PATH = "/v1/chat/completions"

_ids = itertools.count(1)


def openai_compatible_spec(name: str, base_url: str, **fields: Any) -> WorkerSpec:
    """A pool entry for a worker served by a fake at ``base_url`` (model ``model-NAME``)."""
    return WorkerSpec.model_validate(
        {
            "name": name,
            "provider": Provider.OPENAI_COMPATIBLE,
            "model": f"model-{name}",
            "base_url": base_url,
            "price": Price(input=1.0, cached_input=0.5, output=2.0),
            "max_tokens": 32,
            **fields,
        }
    )


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_denied",
    404: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
}


def echo_responder(messages: list[dict[str, Any]]) -> str:
    """The default answer: repeats the last user message, so tests can see what arrived."""
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    return f"echo: {last_user.get('content', '') if last_user else ''}"


def completion_body(
    content: str | None,
    *,
    model: str = "gpt-fake",
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    cached_tokens: int = 0,
    finish_reason: str = "stop",
) -> dict[str, Any]:
    """A ``chat.completion`` object as the API returns it."""
    return {
        "id": f"chatcmpl-fake{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "system_fingerprint": "fp_fake",
    }


def error_body(
    message: str, *, type_: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def completion(content: str | None, *, delay_s: float = 0.0, **fields: Any) -> ScriptedResponse:
    """A scripted 200; ``fields`` go to ``completion_body`` (tokens, model, finish_reason)."""
    return ScriptedResponse(json=completion_body(content, **fields), delay_s=delay_s)


def error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ScriptedResponse:
    """A scripted error response carrying the OpenAI error object."""
    type_ = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return ScriptedResponse(
        status=status,
        json=error_body(message, type_=type_, code=code),
        headers=dict(headers or {}),
    )


def stream_events(
    content: str,
    *,
    model: str = "gpt-fake",
    prompt_tokens: int = 10,
    completion_tokens: int | None = None,
    pieces: int = 3,
    with_done: bool = True,
    with_usage: bool = True,
) -> list[str]:
    """``chat.completion.chunk`` events as the API streams them with ``include_usage``:
    a role chunk, content pieces, a finish chunk, a usage chunk (empty choices), ``[DONE]``."""
    chunk_id = f"chatcmpl-fake{next(_ids)}"

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        body = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": usage,
        }
        return f"data: {json.dumps(body)}\n\n"

    def delta(fields: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": fields, "logprobs": None, "finish_reason": finish}]

    size = max(1, math.ceil(len(content) / pieces))
    events = [chunk(delta({"role": "assistant", "content": ""}))]
    events += [
        chunk(delta({"content": content[i : i + size]})) for i in range(0, len(content), size)
    ]
    events.append(chunk(delta({}, "stop")))
    if with_usage:
        completion = len(content.split()) if completion_tokens is None else completion_tokens
        usage = completion_body("", prompt_tokens=prompt_tokens, completion_tokens=completion)
        events.append(chunk([], usage["usage"]))
    if with_done:
        events.append("data: [DONE]\n\n")
    return events


def streamed(content: str, *, cut_after: int | None = None, **fields: Any) -> ScriptedResponse:
    """A scripted 200 event stream; ``cut_after`` drops the connection after that many events."""
    return ScriptedResponse(events=stream_events(content, **fields), cut_after=cut_after)


def count_tokens(text: str) -> int:
    """The fake's tokenizer: about four characters a token, like English in real tokenizers."""
    return math.ceil(len(text) / 4)


class FakeOpenAIServer(ScriptedServer):
    """Answers ``POST /v1/chat/completions`` with ``responder(messages)`` unless a script is queued.

    Usage in the default answer counts about four characters a token (``count_tokens``), plus
    four per message, so it is deterministic and non-zero. ``latency_s`` delays every default
    answer (benchmarks, quota tests); ``stream: true`` requests get an event stream.
    """

    def __init__(
        self,
        responder: Responder = echo_responder,
        latency_s: float = 0.0,
        word_delay_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.default_responder = responder
        self.responder = responder
        self.latency_s = latency_s
        # Streamed answers come a word an event, this long apart (0: in three pieces at once).
        self.word_delay_s = word_delay_s

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def reset(self) -> None:
        super().reset()
        self.responder = self.default_responder

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path == CHAT_PATH]

    def default_response(self, request: RecordedRequest) -> ScriptedResponse:
        if request.path != CHAT_PATH:
            return error(404, f"Invalid URL ({request.method} {request.path})")
        if request.method != "POST":
            return error(405, f"Method {request.method} not allowed on {request.path}")
        body = request.json
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return error(400, "'messages' is a required property")
        if not isinstance(body.get("model"), str):
            return error(400, "you must provide a model parameter")
        messages: list[dict[str, Any]] = body["messages"]
        content = self.responder(messages)
        prompt = sum(count_tokens(str(m.get("content", ""))) + 4 for m in messages)
        tokens = {"prompt_tokens": prompt, "completion_tokens": count_tokens(content)}
        if body.get("stream") is True:
            with_usage = (body.get("stream_options") or {}).get("include_usage") is True
            pieces = len(content.split()) if self.word_delay_s else 3
            events = stream_events(
                content, model=body["model"], with_usage=with_usage, pieces=pieces, **tokens
            )
            return ScriptedResponse(
                events=events, delay_s=self.latency_s, event_delay_s=self.word_delay_s
            )
        # Whole, it takes as long as its stream would: a model writes at one pace either way.
        writing_s = self.word_delay_s * max(0, len(content.split()) - 1)
        delay_s = self.latency_s + writing_s
        return completion(content, model=body["model"], delay_s=delay_s, **tokens)
