"""A fake Google Gemini API server that speaks the documented generateContent wire format.

Bodies follow https://ai.google.dev/api/generate-content (GenerateContentResponse: candidates
with content parts and finishReason, usageMetadata, modelVersion, responseId); errors use
Google's error object ``{"error": {"code", "message", "status", "details"}}`` as listed in
https://ai.google.dev/gemini-api/docs/troubleshooting. Streams follow ``alt=sse``: one
``data: {chunk}`` event per piece, no end marker, the last chunk carrying finishReason.
Function calling follows https://ai.google.dev/gemini-api/docs/function-calling: ``tools`` of
``functionDeclarations``, ``toolConfig.functionCallingConfig``, ``functionCall`` parts in
answers and ``functionResponse`` parts in requests. Images follow
https://ai.google.dev/gemini-api/docs/image-understanding (``inlineData`` of PNG, JPEG, WEBP,
HEIC or HEIF as base64) and https://ai.google.dev/gemini-api/docs/file-input-methods
(``fileData`` naming an https URL Gemini fetches: PNG, JPEG, WEBP or BMP, not for Gemini 2.0).
JSON answers follow https://ai.google.dev/gemini-api/docs/structured-output
(``generationConfig.responseMimeType`` "application/json", ``responseJsonSchema`` with it).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fakes.http_server import RecordedRequest, ScriptedResponse, ScriptedServer
from fakes.json_answer import PROSE, schema_instance

MODEL_VERSION = "gemini-2.5-flash-fake"
_ROUTE = re.compile(
    r"^/v1beta/models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent)$"
)
_ids = itertools.count(1)
INLINE_IMAGE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"}
)
FETCHED_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/bmp"})
RESPONSE_MIME_TYPES = frozenset({"text/plain", "application/json", "text/x.enum"})


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
    calls: Sequence[Mapping[str, Any]] = (),
    **usage: Any,
) -> dict[str, Any]:
    """A GenerateContentResponse; ``thought`` adds a thought summary part before the answer,
    ``calls`` a functionCall part ({"name", "args", optional "id"}) each after it, ``text=None``
    a candidate without text; ``usage`` goes to ``usage_metadata``."""
    parts: list[dict[str, Any]] = []
    if thought is not None:
        parts.append({"text": thought, "thought": True})
    if text is not None:
        parts.append({"text": text})
    parts.extend({"functionCall": dict(call)} for call in calls)
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


def called(*calls: Mapping[str, Any], text: str | None = None, **fields: Any) -> ScriptedResponse:
    """A scripted 200 whose answer is function calls (after ``text``, if any), as Gemini sends
    them: finishReason STOP, no ids unless a call carries one."""
    return ScriptedResponse(json=response_body(text, calls=calls, **fields))


def request_problem(body: dict[str, Any], model: str = "") -> str | None:
    """What Google's 400 INVALID_ARGUMENT would say of a request's function-calling fields,
    image parts or response format (``model`` is the one called); None when they are well
    formed."""
    config = body.get("generationConfig", {})
    mime_type = config.get("responseMimeType", "text/plain")
    if mime_type not in RESPONSE_MIME_TYPES:
        return f"* generation_config.response_mime_type: unsupported mime type {mime_type!r}"
    if "responseSchema" in config and "responseJsonSchema" in config:
        return "* generation_config: response_schema and response_json_schema are exclusive"
    if "responseJsonSchema" in config and mime_type == "text/plain":
        return "* generation_config.response_mime_type: required with response_json_schema"
    declared = [d for tool in body.get("tools", []) for d in tool.get("functionDeclarations", [])]
    for i, declaration in enumerate(declared):
        if not isinstance(declaration.get("name"), str):
            return f"* tools[0].function_declarations[{i}].name: required"
        if "parameters" in declaration and "parametersJsonSchema" in declaration:
            return f"* function_declarations[{i}]: parameters and parameters_json_schema clash"
    config = body.get("toolConfig", {}).get("functionCallingConfig", {})
    if config.get("mode", "AUTO") not in ("AUTO", "ANY", "NONE", "VALIDATED"):
        return f"Invalid value at 'tool_config.function_calling_config.mode': {config['mode']}"
    allowed = config.get("allowedFunctionNames")
    if allowed is not None and config.get("mode") not in ("ANY", "VALIDATED"):
        return "allowed_function_names may be set only when the mode is ANY or VALIDATED"
    names = {d["name"] for d in declared}
    if allowed is not None and not set(allowed) <= names:
        return f"allowed_function_names names undeclared functions: {sorted(set(allowed) - names)}"
    return _parts_problem(body["contents"]) or _images_problem(body["contents"], model)


def _parts_problem(contents: list[Any]) -> str | None:
    """Ill-formed calls or results, or results that do not answer the turn of calls before
    them one for one."""
    calls_before = 0
    for i, content in enumerate(contents):
        parts = content.get("parts", [])
        for j, part in enumerate(parts):
            call, result = part.get("functionCall"), part.get("functionResponse")
            if call is not None and not isinstance(call.get("args", {}), dict):
                return f"* contents[{i}].parts[{j}].function_call.args: must be an object"
            if result is not None and not (
                isinstance(result.get("name"), str) and isinstance(result.get("response"), dict)
            ):
                return f"* contents[{i}].parts[{j}].function_response: name and response object"
        results = sum("functionResponse" in part for part in parts)
        if results and results != calls_before:
            return (
                "Please ensure that the number of function response parts is equal to the "
                "number of function call parts of the function call turn."
            )
        calls_before = sum("functionCall" in part for part in parts)
    return None


def _images_problem(contents: list[Any], model: str) -> str | None:
    """Image parts Gemini refuses: inline data of a type it does not read or not base64, a file
    URI that is not https, or a fetched image of a type it does not fetch (or for a 2.0 model)."""
    for i, content in enumerate(contents):
        for j, part in enumerate(content.get("parts", [])):
            where = f"contents[{i}].parts[{j}]"
            if "inlineData" in part:
                inline = part["inlineData"]
                if inline.get("mimeType") not in INLINE_IMAGE_TYPES:
                    return f"* {where}.inline_data: Unsupported MIME type: {inline.get('mimeType')}"
                if not _is_base64(inline.get("data")):
                    return f"Invalid value at '{where}.inline_data.data': Base64 decoding failed"
            if "fileData" in part:
                problem = _file_problem(part["fileData"], model)
                if problem is not None:
                    return f"* {where}.file_data: {problem}"
    return None


def _is_base64(data: Any) -> bool:
    try:
        return isinstance(data, str) and bool(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return False


def _file_problem(file: dict[str, Any], model: str) -> str | None:
    uri, mime_type = file.get("fileUri"), file.get("mimeType")
    if not isinstance(uri, str) or not uri.startswith("https://"):
        return f"Unsupported file uri: {uri}"
    if model.startswith("gemini-2.0"):
        return "External URLs are not supported for this model"
    if mime_type not in FETCHED_IMAGE_TYPES:
        return f"Unsupported MIME type for a URL: {mime_type}"
    return None


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
    PERMISSION_DENIED, a body without a ``contents`` list or with ill-formed function-calling
    fields, image parts or response format 400 INVALID_ARGUMENT, an unknown route 404
    NOT_FOUND. Usage counts about four characters a token plus four per content. With
    ``functionCallingConfig.mode`` ANY the answer is a call, without arguments, to the first
    function allowed. A request whose ``responseMimeType`` is "application/json" is answered
    with JSON that follows its ``responseJsonSchema`` (``{"answer": ...}`` without one); with
    ``prose_unless_asked_natively`` set (a model that ignores JSON instructions in the prompt),
    any other request is answered with prose. ``latency_s`` delays every default answer.
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
        problem = request_problem(body, route["model"])
        if problem is not None:
            return error(400, "INVALID_ARGUMENT", problem)
        contents: list[Any] = body["contents"]
        last_user = next(
            (c for c in reversed(contents) if isinstance(c, dict) and c.get("role") == "user"),
            None,
        )
        answer = f"echo: {content_text(last_user)}"
        config = body.get("generationConfig", {})
        if config.get("responseMimeType") == "application/json":
            schema = config.get("responseJsonSchema")
            value = {"answer": answer} if schema is None else schema_instance(schema)
            answer = json.dumps(value)
        elif self.prose_unless_asked_natively:
            answer = PROSE
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
        forced = _forced_call(body)
        if forced is not None:
            return generated(
                None,
                calls=[forced],
                model_version=model,
                delay_s=self.latency_s,
                prompt_tokens=prompt,
                candidates_tokens=count_tokens(json.dumps(forced)),
            )
        return generated(
            answer,
            model_version=model,
            delay_s=self.latency_s,
            prompt_tokens=prompt,
            candidates_tokens=count_tokens(answer),
        )


def _forced_call(body: dict[str, Any]) -> dict[str, Any] | None:
    """The call a request in mode ANY gets: the first function it allows, with no arguments."""
    config = body.get("toolConfig", {}).get("functionCallingConfig", {})
    if config.get("mode") != "ANY":
        return None
    declared = [d["name"] for tool in body["tools"] for d in tool["functionDeclarations"]]
    return {"name": (config.get("allowedFunctionNames") or declared)[0], "args": {}}
