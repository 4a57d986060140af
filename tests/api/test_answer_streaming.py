"""A streamed answer's text as its worker writes it: chat completions and the Responses API on
a variant, read with the openai SDK, on both runtimes (distributed: from the gateway to the
API through Redis). teller, streamed, writes its answer a word every 0.05 s: the first word
reaches the client while teller is still writing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from fakes.api_fixture import QUESTION, TOLD, Api
from fakes.scripted import ScriptedWorker

ONLY_TELLER = {"conductor": {"pool": ["teller"]}}


def _read_chat(stream: Iterable[Any], teller: ScriptedWorker) -> tuple[list[str], bool]:
    """A chat stream's text pieces, and whether teller was still writing when the first came."""
    pieces: list[str] = []
    writing_when_first_came = False
    for chunk in stream:
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            if not pieces:
                writing_when_first_came = teller.calls[-1].finished == 0.0
            pieces.append(text)
    return pieces, writing_when_first_came


def test_a_chat_stream_gets_the_answer_as_the_worker_writes_it(
    api: Api, request: pytest.FixtureRequest
) -> None:
    teller = api.workers["teller"]
    client = api.client()
    request.addfinalizer(client.close)
    stream = client.chat.completions.create(
        model="conductor-ultra",
        messages=QUESTION,  # type: ignore[arg-type]
        stream=True,
        extra_body=ONLY_TELLER,
    )
    pieces, writing_when_first_came = _read_chat(stream, teller)

    assert "".join(pieces) == TOLD
    assert writing_when_first_came is True
    assert len(pieces) == len(TOLD.split(" "))


def test_a_responses_stream_gets_the_answer_as_the_worker_writes_it(
    api: Api, request: pytest.FixtureRequest
) -> None:
    teller = api.workers["teller"]
    client = api.client()
    request.addfinalizer(client.close)
    stream = client.responses.create(
        model="conductor-ultra", input="What is 6 * 7?", stream=True, extra_body=ONLY_TELLER
    )
    deltas: list[str] = []
    writing_when_first_came: bool | None = None
    done_text = None
    kinds: list[str] = []
    numbers: list[int] = []
    for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            if writing_when_first_came is None:
                writing_when_first_came = teller.calls[-1].finished == 0.0
            deltas.append(event.delta)
        elif event.type == "response.completed":
            done_text = event.response.output_text

    assert "".join(deltas) == TOLD
    assert done_text == TOLD
    # numbered from 0 without a gap, the response created first, as the SDK expects
    assert numbers == list(range(len(numbers)))
    assert kinds[0] == "response.created"
    assert writing_when_first_came is True


def test_a_whole_answer_is_not_streamed(api: Api, request: pytest.FixtureRequest) -> None:
    """A client that does not stream gets the answer whole, from a call made whole."""
    teller = api.workers["teller"]
    streams = teller.streams
    client = api.client()
    request.addfinalizer(client.close)
    reply = client.chat.completions.create(
        model="conductor-ultra",
        messages=QUESTION,  # type: ignore[arg-type]
        extra_body=ONLY_TELLER,
    )
    assert reply.choices[0].message.content == TOLD
    assert teller.streams == streams


def test_a_streamed_call_of_a_worker_gets_its_text_as_it_writes_it(
    api: Api, request: pytest.FixtureRequest
) -> None:
    teller = api.workers["teller"]
    client = api.client()
    request.addfinalizer(client.close)
    stream = client.chat.completions.create(
        model="teller",
        messages=QUESTION,  # type: ignore[arg-type]
        stream=True,
    )
    pieces, writing_when_first_came = _read_chat(stream, teller)

    assert "".join(pieces) == TOLD
    assert writing_when_first_came is True

    # and through the Responses API, its events numbered without a gap
    events = list(client.responses.create(model="teller", input="What is 6 * 7?", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == TOLD
    assert len(deltas) == len(TOLD.split(" "))
    assert events[-1].response.output_text == TOLD  # type: ignore[union-attr]
