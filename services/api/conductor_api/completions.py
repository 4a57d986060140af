"""``/v1/completions``: the legacy completion API, as a thin shim over chat completions.

The prompt becomes one user message and takes the chat completion's path (a workflow for a
variant, a pass-through call for a worker's name, the same limits, errors and cancellation);
the answer is rewritten as a ``text_completion``, streamed or not. Clients whose default is
this endpoint (LlamaIndex's ``OpenAILike``) work as they are.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response

from conductor.errors import InvalidRequest
from conductor_api.auth import CallerDep
from conductor_api.chat import chat_completions
from conductor_api.chat_request import ChatCompletionRequest
from conductor_api.errors import ApiError, unsupported
from conductor_api.request_policy import COMPLETION, refuse_unsupported
from conductor_api.responses_request import checked_text
from conductor_api.responses_schemas import CompletionRequest, TextCompletion
from conductor_api.schemas import EVENT_STREAM, ChatMessageIn
from conductor_api.sse import STREAM_HEADERS, data_line

router = APIRouter(tags=["OpenAI-compatible"])


def _check(body: CompletionRequest) -> str:
    """The prompt; a 400 for what a workflow cannot honour."""
    refuse_unsupported(body, COMPLETION)
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    elif isinstance(prompt, list):
        raise unsupported("prompt", f"one prompt per request, not {len(prompt)}")
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt: expected a string", param="prompt")
    return checked_text(prompt, "prompt")


def _as_prompt(error: ApiError | InvalidRequest) -> ApiError:
    """A refusal of the chat path, naming the prompt where it named the messages."""
    if isinstance(error, InvalidRequest):
        error = ApiError(400, str(error), param=error.param)
    if error.param is not None and error.param.startswith("messages"):
        message = error.message.replace("messages.0.content", "prompt").replace(
            "messages", "prompt", 1
        )
        error = ApiError(error.status, message, code=error.code, param="prompt", retry=error.retry)
    return error


def _choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}


def _text_completion(chunk: dict[str, Any], *, streamed: bool) -> dict[str, Any]:
    """A chat.completion (or one of its chunks) as a text_completion."""
    choices = []
    for choice in chunk.get("choices", []):
        content = (choice.get("delta") if streamed else choice.get("message")) or {}
        choices.append(_choice(content.get("content") or "", choice.get("finish_reason")))
    body: dict[str, Any] = {
        "id": "cmpl-" + str(chunk.get("id", "")).removeprefix("chatcmpl-"),
        "object": "text_completion",
        "created": chunk.get("created"),
        "model": chunk.get("model"),
        "choices": choices,
    }
    for extra in ("usage", "conductor"):
        if extra in chunk:
            body[extra] = chunk[extra]
    return body


async def _rewritten(lines: AsyncIterable[str | bytes | memoryview]) -> AsyncIterator[str]:
    """The chat stream's lines, each chunk as a text_completion; comments, errors and the
    closing [DONE] as they are. Closing this stream closes the chat's (which cancels its
    workflow when the client went away)."""
    source = aiter(lines)
    async with contextlib.aclosing(source):  # type: ignore[type-var]
        async for line in source:
            text = line if isinstance(line, str) else bytes(line).decode()
            if not text.startswith("data: {"):
                yield text
                continue
            chunk = json.loads(text.removeprefix("data: "))
            if chunk.get("object") == "chat.completion.chunk":
                yield data_line(_text_completion(chunk, streamed=True))
            else:
                yield text


@router.post(
    "/v1/completions",
    response_model=None,
    responses={
        200: {
            "model": TextCompletion,
            "description": "A text_completion; with stream=true, text_completion events",
            "content": EVENT_STREAM,
        }
    },
)
async def completions(
    body: CompletionRequest, request: Request, caller: CallerDep
) -> JSONResponse | StreamingResponse:
    """Complete the prompt as a chat completion of one user message: a workflow (model = a
    variant) or one worker (model = its name). Extra fields ``conductor`` and ``metadata`` as in
    chat completions."""
    prompt = _check(body)
    chat = ChatCompletionRequest.model_construct(
        model=body.model,
        messages=[ChatMessageIn.model_construct(role="user", content=prompt)],
        stream=body.stream,
        stream_options=body.stream_options,
        n=1,
        conductor=body.conductor,
        metadata=body.metadata,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
    )
    try:
        answer: Response = await chat_completions(chat, request, caller)
    except (ApiError, InvalidRequest) as error:
        raise _as_prompt(error) from None
    if isinstance(answer, StreamingResponse):
        return StreamingResponse(
            _rewritten(answer.body_iterator),
            media_type="text/event-stream",
            headers=STREAM_HEADERS,
        )
    completion = json.loads(bytes(answer.body))
    return JSONResponse(_text_completion(completion, streamed=False))
