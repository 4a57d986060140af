"""``/v1/completions``: the legacy completion API, as a thin shim over chat completions.

The prompt becomes one user message and takes the chat completion's path (a workflow for a
variant, a pass-through call for a worker's name, the same limits, errors and cancellation);
the answer is written as a ``text_completion`` (``TextFormat``), streamed or not. Clients
whose default is this endpoint (LlamaIndex's ``OpenAILike``) work as they are.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conductor.chat import ToolCall
from conductor.errors import InvalidRequest
from conductor_api.auth import CallerDep, ServiceDep
from conductor_api.chat import ChatFormat, answer_chat
from conductor_api.chat_request import ChatCompletionRequest
from conductor_api.errors import ApiError, unsupported
from conductor_api.request_policy import COMPLETION, refuse_unsupported
from conductor_api.responses_request import checked_text
from conductor_api.responses_schemas import CompletionRequest, TextCompletion
from conductor_api.schemas import EVENT_STREAM, ChatMessageIn
from conductor_api.sse import data_line

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


class TextFormat(ChatFormat):
    """The chat answer written as ``text_completion`` objects, whole or streamed."""

    prefix = "cmpl-"

    def _body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        head = {"id": self.id, "object": "text_completion", "created": self.created}
        return {**head, "model": self.model, "choices": choices, **extra}

    def whole(
        self,
        text: str,
        usage: dict[str, Any],
        extra: Any,
        tool_calls: list[ToolCall] | None = None,
        finish: str = "stop",
    ) -> dict[str, Any]:
        return self._body([_choice(text, finish)], usage=usage, conductor=extra)

    def delta(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        return data_line(self._body([_choice(delta.get("content") or "", finish)], **extra))

    def usage(self, usage: dict[str, Any]) -> str:
        return data_line(self._body([], usage=usage))


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
    body: CompletionRequest, request: Request, service: ServiceDep, caller: CallerDep
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
        return await answer_chat(chat, request, service, caller, TextFormat)
    except (ApiError, InvalidRequest) as error:
        raise _as_prompt(error) from None
