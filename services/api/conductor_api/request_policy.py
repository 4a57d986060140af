"""One request policy for every HTTP door: chat completions, completions, responses, the job API.

- A field the API does not know is a 400 that names it (``code: unknown_parameter``): every
  request model forbids extra fields, and the error handler names them all
  (``errors.unknown_fields``).
- A field the API knows but cannot honour is a 400 that names it and says why (``code:
  unsupported_parameter``), unless it carries the value that asks for nothing: the tables below,
  one per door (``logprobs: false``, ``modalities: ["text"]``, ``service_tier: "auto"``...).
- The fields clients send that do not change what is answered (sampling hints, identifiers,
  cache keys, reasoning settings) are accepted and have no effect; their request models say
  so, and docs/serving.md lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from conductor_api.chat_request import ChatCompletionRequest
from conductor_api.errors import ApiError, unsupported
from conductor_api.images import IMAGE_PART

LOGPROBS = "log probabilities are not available: a workflow's answer comes from several models"


@dataclass(frozen=True)
class Refusal:
    """A field refused unless ``neutral`` holds for its value, with the reason why."""

    neutral: Callable[[Any], bool]
    reason: str


def _null(value: Any) -> bool:
    return value is None


def blank(value: Any) -> bool:
    """Null, or an object whose values are all null."""
    return value is None or (isinstance(value, dict) and all(v is None for v in value.values()))


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def _false(value: Any) -> bool:
    return value is None or value is False


def _zero(value: Any) -> bool:
    # 0 only: not False, which equals 0 in Python
    return value is None or (type(value) is int and value == 0)


def _only(*allowed: str) -> Callable[[Any], bool]:
    return lambda value: value is None or (isinstance(value, str) and value in allowed)


SERVICE_TIER = Refusal(_only("auto", "default"), 'only "auto" or "default"')
LOGIT_BIAS = Refusal(_empty, "token biases are not supported: the workers' tokenizers differ")
CACHE_OPTIONS = Refusal(blank, "prompt cache options are not supported")
CACHE_RETENTION = Refusal(_null, "prompt cache retention is not supported")
MODERATION = Refusal(blank, "moderation is not supported")

CHAT: Mapping[str, Refusal] = {
    "modalities": Refusal(lambda v: v is None or v == ["text"], 'answers are text: only ["text"]'),
    "audio": Refusal(_null, "audio output is not supported: answers are text"),
    "web_search_options": Refusal(_null, "web search is not supported: no worker searches the web"),
    "prediction": Refusal(_null, "predicted outputs are not supported"),
    "logprobs": Refusal(_false, LOGPROBS),
    "top_logprobs": Refusal(_zero, LOGPROBS),
    "logit_bias": LOGIT_BIAS,
    "functions": Refusal(_null, "functions are deprecated: send them as tools"),
    "function_call": Refusal(_null, "function_call is deprecated: use tool_choice"),
    "service_tier": SERVICE_TIER,
    "verbosity": Refusal(_only("medium"), "verbosity cannot be set: each worker answers its way"),
    "moderation": MODERATION,
    "prompt_cache_options": CACHE_OPTIONS,
    "prompt_cache_retention": CACHE_RETENTION,
}

COMPLETION: Mapping[str, Refusal] = {
    "echo": Refusal(_false, "the prompt is not echoed; only false"),
    "suffix": Refusal(_null, "a suffix (insertion) is not supported"),
    "logprobs": Refusal(_null, LOGPROBS),
    "logit_bias": LOGIT_BIAS,
}

RESPONSES: Mapping[str, Refusal] = {
    "truncation": Refusal(
        _only("disabled"), 'only "disabled": a conversation over the limit is refused, never cut'
    ),
    "background": Refusal(
        _false,
        "background responses are not supported: submit the question to the job API "
        "(POST /v1/workflows) to run it without waiting",
    ),
    "service_tier": SERVICE_TIER,
    "top_logprobs": Refusal(_zero, LOGPROBS),
    "conversation": Refusal(
        blank, "conversations are not supported; continue with previous_response_id"
    ),
    "prompt": Refusal(blank, "prompt templates are not supported; send the input"),
    "context_management": Refusal(blank, "context management is not supported"),
    "moderation": MODERATION,
    "prompt_cache_options": CACHE_OPTIONS,
    "prompt_cache_retention": CACHE_RETENTION,
}


def refuse_unsupported(body: BaseModel, refusals: Mapping[str, Refusal]) -> None:
    """A 400 naming the first field of ``refusals`` whose value asks for what Conductor cannot
    do, rather than a request silently half-honoured."""
    for name, refusal in refusals.items():
        if not refusal.neutral(getattr(body, name, None)):
            raise unsupported(name, refusal.reason)


def check_chat(body: ChatCompletionRequest) -> None:
    """The chat request's fields (``CHAT``), then its messages' content: text parts, and
    images where the route lets them go (``images.check_images``)."""
    refuse_unsupported(body, CHAT)
    for i, message in enumerate(body.messages):
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            raise ApiError(400, f"messages[{i}].content: required", param=f"messages[{i}]")
        if isinstance(message.content, list):
            for j, part in enumerate(message.content):
                if part.type == IMAGE_PART:
                    continue  # where images may go is the route's to say (check_images)
                if part.type != "text":
                    raise unsupported(
                        f"messages[{i}].content[{j}]",
                        f"{part.type} content is not supported: send text parts, and images "
                        "to a worker called directly",
                    )
                if part.text is None:
                    raise ApiError(
                        400, "a text part needs its text", param=f"messages[{i}].content[{j}]"
                    )
