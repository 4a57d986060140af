"""Streamed answers: the events every provider adapter yields, and their collection into one.

Vendors mark the end of a stream differently (OpenAI ``[DONE]``, Anthropic ``message_stop``,
Gemini a chunk carrying ``finishReason``). Each adapter translates its vendor's stream into
TextDelta events closed by exactly one StreamEnd; a stream without its StreamEnd was cut, and
its text is never returned as a complete answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import StreamInterrupted


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class StreamEnd:
    usage: Usage
    finish_reason: str | None = None
    model: str = ""
    cost_usd: float | None = None  # Completion.cost_usd, carried through a stream


StreamEvent = TextDelta | StreamEnd


async def collect_stream(events: AsyncIterator[StreamEvent], provider: str) -> Completion:
    """Join a stream's deltas into a Completion; StreamInterrupted when it has no end."""
    parts: list[str] = []
    async for event in events:
        if isinstance(event, StreamEnd):
            return Completion(
                text="".join(parts),
                usage=event.usage,
                model=event.model,
                finish_reason=event.finish_reason,
                cost_usd=event.cost_usd,
            )
        parts.append(event.text)
    received = sum(len(p) for p in parts)
    raise StreamInterrupted(
        f"{provider}: the stream ended without its end marker after {received} characters"
    )


class WholeAnswerStream:
    """``stream`` for workers that answer in one piece (the local engine, the simulator): one
    delta and the end, so callers that ask for a stream get the same interface."""

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        raise NotImplementedError

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        completion = await self.complete(messages, max_tokens=max_tokens, temperature=temperature)
        yield TextDelta(completion.text)
        yield StreamEnd(
            completion.usage, completion.finish_reason, completion.model, completion.cost_usd
        )
