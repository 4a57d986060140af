"""A streamed answer's text in Redis: one stream per workflow (or per call of one worker), a
piece per entry, appended by the gateway that runs the step as its worker writes it and read by
the process that holds the client's stream. The keys are ``conductor.messaging``'s
(``answer_stream_key``)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from conductor.messaging import ANSWER_STREAM_TTL_S

FIELD = "text"
START = "0-0"  # read from a stream's first entry


async def append_piece(redis: aioredis.Redis, key: str, text: str) -> None:
    """Append one piece, and keep the stream ``ANSWER_STREAM_TTL_S`` past its last one."""
    writes = redis.pipeline(transaction=False)
    writes.xadd(key, {FIELD: text})
    writes.expire(key, ANSWER_STREAM_TTL_S)
    await writes.execute()


async def read_pieces(
    redis: aioredis.Redis, key: str, after: str, block_ms: int | None
) -> tuple[str, list[str]]:
    """The pieces past entry ``after``, waiting up to ``block_ms`` for one (None: not at all),
    and the id to read after next time."""
    read: Any = await redis.xread({key: after}, block=block_ms)
    if not read:
        return after, []
    entries = read[0][1]
    return entries[-1][0], [_text(fields) for _, fields in entries]


def _text(fields: dict[Any, Any]) -> str:
    value = fields.get(FIELD.encode(), fields.get(FIELD, b""))
    return value.decode() if isinstance(value, bytes) else str(value)
