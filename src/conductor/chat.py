"""Chat messages, token usage and completions: what flows between planner, workers and executor."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]
# An inline image's data URL: 20 MB of base64 (about 15 MB of image), OpenAI's own limit.
MAX_IMAGE_URL_CHARS = 20_000_000


class ToolCall(BaseModel):
    """A function call a model asked for: the client runs it and sends back its result."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    arguments: str  # JSON text, as the model wrote it (it may not parse)


class ImagePart(BaseModel):
    """An image a user turn shows the model: a ``data:<media type>;base64,...`` URL carrying
    the image, or an http(s) URL the provider fetches it from."""

    model_config = ConfigDict(frozen=True)

    url: str = Field(min_length=1, max_length=MAX_IMAGE_URL_CHARS)
    detail: Literal["auto", "low", "high"] | None = None  # OpenAI's; others ignore it

    @property
    def inline(self) -> tuple[str, str] | None:
        """(media type, base64 data) of a data URL; None for an http(s) URL."""
        if not self.url.startswith("data:"):
            return None
        header, _, data = self.url.partition(",")
        return header.removeprefix("data:").removesuffix(";base64"), data


class ChatMessage(BaseModel):
    """One turn. A user turn may show images (after its text); an assistant turn may carry the
    tool calls it asked for; a ``tool`` turn is one call's result, named by ``tool_call_id``."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    images: tuple[ImagePart, ...] = ()

    def as_text_turn(self) -> dict[str, str]:
        """``{"role", "content"}``: the turn as chat templates and local engines take it (they
        read text turns only; a null field breaks llama.cpp's parser)."""
        return {"role": self.role, "content": self.content}


class ToolSpec(BaseModel):
    """A function the model may call: its name, what it does, its parameters' JSON Schema."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Sampling(BaseModel):
    """A direct call's own settings: at most ``max_tokens`` (never more than the pool file
    gives the worker: the operator's ceiling), ``temperature`` instead of the worker's."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)


class ToolUse(BaseModel):
    """The tools a client offers a call and how the model may use them: ``choice`` is "auto",
    "none", "required", or a tool's name (that tool must be called)."""

    model_config = ConfigDict(frozen=True)

    tools: tuple[ToolSpec, ...] = Field(min_length=1, max_length=128)
    choice: str = "auto"
    parallel: bool | None = None  # None: the provider's default


class Usage(BaseModel):
    """Token counts of one or more model calls (OpenAI field names)."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)  # part of prompt_tokens served from cache
    reasoning_tokens: int = Field(default=0, ge=0)  # part of completion_tokens spent thinking

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


class Completion(BaseModel):
    """One model call's answer, as returned by a worker or a planner backend."""

    model_config = ConfigDict(frozen=True)

    text: str
    usage: Usage = Usage()
    model: str = ""
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # the functions the model asks the client to run
    # What the call cost when the worker knows it better than the pool's price (a replayed
    # call's recorded cost); None: the gateway prices the usage.
    cost_usd: float | None = Field(default=None, ge=0)
