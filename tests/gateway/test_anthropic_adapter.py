"""The Anthropic Messages API worker adapter against a fake Anthropic server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from conductor.chat import ChatMessage, Completion
from conductor.errors import (
    ConfigurationError,
    MalformedResponse,
    ProviderAuthError,
    ProviderRejected,
    ProviderUnavailable,
    RateLimited,
    StreamInterrupted,
    WorkerError,
    WorkerUnavailable,
)
from conductor.pool import Provider, WorkerSpec
from conductor.ports import ChatWorker
from conductor.streaming import StreamEnd, StreamEvent, TextDelta, collect_stream
from conductor_gateway.providers.anthropic import AnthropicWorker

from fakes.anthropic_server import (
    FakeAnthropicServer,
    error,
    error_event,
    message,
    message_body,
    sse,
    stream_events,
    streamed,
)
from fakes.http_server import ScriptedResponse

KEY = "sk-ant-test"
KEY_ENV = "ANTHROPIC_TEST_KEY"
QUESTION = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi")]


@pytest.fixture
def fake(fake_anthropic: FakeAnthropicServer) -> FakeAnthropicServer:
    return fake_anthropic


def spec(base_url: str | None, **overrides: Any) -> WorkerSpec:
    fields: dict[str, Any] = {
        "name": "claude",
        "provider": Provider.ANTHROPIC,
        "model": "claude-sonnet-4-5",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout_s": 5.0,
    }
    return WorkerSpec(**(fields | overrides))


@pytest.fixture
async def worker(fake: FakeAnthropicServer) -> AsyncIterator[AnthropicWorker]:
    adapter = AnthropicWorker.from_spec(spec(fake.base_url), environ={KEY_ENV: KEY})
    yield adapter
    await adapter.aclose()


async def call(
    worker: AnthropicWorker, messages: list[ChatMessage] = QUESTION, temperature: float = 0.5
) -> Completion:
    return await worker.complete(messages, max_tokens=64, temperature=temperature)


async def call_streamed(worker: AnthropicWorker) -> Completion:
    return await collect_stream(worker.stream(QUESTION, max_tokens=64, temperature=0.5), "x")


# -- request -------------------------------------------------------------------------------


async def test_request_carries_path_headers_model_and_system_prompt(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    result = await call(worker)

    assert result.text == "echo: Hi"
    assert isinstance(worker, ChatWorker)
    sent = fake.last_request
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers
    assert sent.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
        "system": "Be brief.",
        "temperature": 0.5,
    }


async def test_turns_are_merged_to_alternate_and_start_with_the_user(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    transcript = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="assistant", content="Earlier answer."),
        ChatMessage(role="system", content="Answer in English."),
        ChatMessage(role="user", content="First part."),
        ChatMessage(role="user", content="Second part."),
        ChatMessage(role="assistant", content="Noted."),
        ChatMessage(role="user", content="Go on."),
    ]

    result = await call(worker, transcript)

    sent = fake.last_request.json
    assert result.text == "echo: Go on."  # the fake refuses turns that do not alternate
    assert sent["system"] == "Be brief.\n\nAnswer in English."
    assert [m["role"] for m in sent["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert sent["messages"][0]["content"]  # a stand-in turn: the API refuses an empty one
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": "Earlier answer."},
        {"role": "user", "content": "First part.\n\nSecond part."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Go on."},
    ]


async def test_no_system_field_without_system_messages(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    await call(worker, [ChatMessage(role="user", content="Hi")])

    assert "system" not in fake.last_request.json


@pytest.mark.parametrize(("asked", "sent"), [(1.7, 1.0), (2.0, 1.0), (1.0, 1.0), (0.0, 0.0)])
async def test_temperature_is_clamped_to_anthropics_range(
    fake: FakeAnthropicServer, worker: AnthropicWorker, asked: float, sent: float
) -> None:
    await call(worker, temperature=asked)

    assert fake.last_request.json["temperature"] == sent


# -- answer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache_write", "cache_read", "prompt", "cached"),
    [(20, 30, 60, 30), (0, 0, 10, 0), (None, None, 10, 0)],
)
async def test_usage_counts_cache_reads_and_writes_in_the_prompt(
    fake: FakeAnthropicServer,
    worker: AnthropicWorker,
    cache_write: int | None,
    cache_read: int | None,
    prompt: int,
    cached: int,
) -> None:
    fake.enqueue(
        message(
            "ok",
            input_tokens=10,
            output_tokens=5,
            cache_creation_input_tokens=cache_write,
            cache_read_input_tokens=cache_read,
        )
    )

    result = await call(worker)

    assert result.usage.prompt_tokens == prompt
    assert result.usage.cached_tokens == cached
    assert (result.usage.completion_tokens, result.usage.reasoning_tokens) == (5, 0)


async def test_usage_fields_may_be_absent(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    body = message_body("ok")
    body["usage"] = {"input_tokens": 7, "output_tokens": 2}
    fake.enqueue(ScriptedResponse(json=body))

    result = await call(worker)

    assert (result.usage.prompt_tokens, result.usage.cached_tokens) == (7, 0)


async def test_text_blocks_are_joined_and_thinking_is_skipped(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    body = message_body("", thinking="Let me think.", stop_reason="max_tokens")
    body["content"] += [
        {"type": "text", "text": "Hello, "},
        {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}},
        {"type": "text", "text": "world."},
    ]
    fake.enqueue(ScriptedResponse(json=body))

    result = await call(worker)

    assert result.text == "Hello, world."
    assert result.finish_reason == "max_tokens"
    assert result.model == "claude-fake"


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "type_", "raised"),
    [
        (400, "invalid_request_error", ProviderRejected),
        (404, "not_found_error", ProviderRejected),
        (413, "request_too_large", ProviderRejected),
        (401, "authentication_error", ProviderAuthError),
        (403, "permission_error", ProviderAuthError),
        (429, "rate_limit_error", RateLimited),
        (500, "api_error", ProviderUnavailable),
        (529, "overloaded_error", ProviderUnavailable),
    ],
)
async def test_error_statuses_map_onto_the_exception_tree(
    fake: FakeAnthropicServer,
    worker: AnthropicWorker,
    status: int,
    type_: str,
    raised: type[WorkerError],
) -> None:
    fake.enqueue(error(status, type_, "Something specific went wrong."))

    with pytest.raises(raised) as caught:
        await call(worker)

    assert type(caught.value) is raised
    assert caught.value.status_code == status
    assert caught.value.retryable is (status in (429, 500, 529))
    assert "Something specific went wrong." in str(caught.value)
    assert type_ in str(caught.value)
    assert "worker 'claude'" in str(caught.value)


async def test_429_carries_retry_after(fake: FakeAnthropicServer, worker: AnthropicWorker) -> None:
    fake.enqueue(error(429, "rate_limit_error", "Slow down.", headers={"retry-after": "7"}))

    with pytest.raises(RateLimited) as caught:
        await call(worker)

    assert caught.value.retry_after_s == 7.0


def _with(**fields: Any) -> dict[str, Any]:
    return message_body("hi") | fields


@pytest.mark.parametrize(
    ("scripted", "says"),
    [
        (ScriptedResponse(body="<html>gateway hiccup</html>"), "not JSON"),
        (ScriptedResponse(json=["not", "an", "object"]), "expected a JSON object, got list"),
        (ScriptedResponse(json={"id": "msg_1", "type": "message"}), "'content' must be a list"),
        (ScriptedResponse(json=_with(content="hi")), "'content' must be a list, got str"),
        (ScriptedResponse(json=_with(content=["hi"])), r"content\[0\] must be an object"),
        (ScriptedResponse(json=_with(content=[{"type": "text"}])), "text must be a string"),
        (ScriptedResponse(json=_with(usage=None)), "usage must be an object"),
        (
            ScriptedResponse(json=_with(usage={"input_tokens": "10", "output_tokens": 5})),
            r"usage\.input_tokens must be a non-negative integer",
        ),
        (
            ScriptedResponse(json=_with(usage={"input_tokens": 1, "output_tokens": 5.5})),
            r"usage\.output_tokens must be a non-negative integer",
        ),
        (
            ScriptedResponse(
                json=_with(
                    usage={"input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": -2}
                )
            ),
            r"usage\.cache_read_input_tokens must be a non-negative integer",
        ),
        (ScriptedResponse(json=_with(stop_reason=3)), "'stop_reason' must be a string"),
        (
            ScriptedResponse(
                json={"type": "error", "error": {"type": "api_error", "message": "x"}}
            ),
            "2xx response carries an error",
        ),
    ],
)
async def test_malformed_bodies(
    fake: FakeAnthropicServer, worker: AnthropicWorker, scripted: ScriptedResponse, says: str
) -> None:
    fake.enqueue(scripted)

    with pytest.raises(MalformedResponse, match=says) as caught:
        await call(worker)

    assert caught.value.retryable


# -- streaming -----------------------------------------------------------------------------


async def test_stream_yields_the_full_text_and_usage(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    fake.enqueue(
        streamed(
            "The quick brown fox.",
            thinking="Hmm.",
            input_tokens=10,
            output_tokens=9,
            cache_creation_input_tokens=3,
            cache_read_input_tokens=4,
            stop_reason="end_turn",
        )
    )

    result = await call_streamed(worker)

    assert result.text == "The quick brown fox."  # thinking deltas are not the answer
    assert (result.usage.prompt_tokens, result.usage.cached_tokens) == (17, 4)
    assert result.usage.completion_tokens == 9  # message_delta's count, not message_start's
    assert (result.finish_reason, result.model) == ("end_turn", "claude-fake")
    assert fake.last_request.json["stream"] is True


async def test_stream_from_the_default_answer(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    events = [event async for event in worker.stream(QUESTION, max_tokens=64, temperature=0.5)]

    assert isinstance(events[-1], StreamEnd)
    assert sum(isinstance(e, StreamEnd) for e in events) == 1
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "echo: Hi"


def _without_event_lines(events: list[str]) -> list[str]:
    return [
        "".join(line for line in e.splitlines(True) if not line.startswith("event:"))
        for e in events
    ]


@pytest.mark.parametrize(
    "events",
    [
        # Unknown event kinds are skipped unread, as the streaming docs ask of clients.
        [
            *stream_events("Still fine.")[:2],
            "event: future_kind\ndata: <not json>\n\n",
            *stream_events("Still fine.")[2:],
        ],
        # No ``event:`` lines: the data's own "type" names the event.
        _without_event_lines(stream_events("Still fine.")),
    ],
    ids=["unknown-event", "no-event-lines"],
)
async def test_stream_tolerates_what_the_docs_allow(
    fake: FakeAnthropicServer, worker: AnthropicWorker, events: list[str]
) -> None:
    fake.enqueue(ScriptedResponse(events=events))

    result = await call_streamed(worker)

    assert result.text == "Still fine."
    assert result.finish_reason == "end_turn"


async def test_stream_cut_midway_is_interrupted_and_shows_no_partial_text(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # message_start, ping, content_block_start, then one text delta before the cut.
    fake.enqueue(streamed("One two three four five six.", cut_after=4))
    seen: list[StreamEvent] = []

    with pytest.raises(StreamInterrupted) as caught:
        await drain(worker.stream(QUESTION, max_tokens=64, temperature=0.5), seen)

    assert caught.value.retryable
    assert seen  # some text arrived before the cut...
    assert all(isinstance(e, TextDelta) for e in seen)  # ...but never an end
    fake.enqueue(streamed("One two three four five six.", cut_after=4))
    with pytest.raises(StreamInterrupted):
        await call_streamed(worker)


async def drain(events: AsyncIterator[StreamEvent], into: list[StreamEvent]) -> None:
    async for event in events:
        into.append(event)


async def test_stream_ending_without_message_stop_is_interrupted(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    fake.enqueue(streamed("Almost done.", with_stop=False))

    with pytest.raises(StreamInterrupted, match="without its end marker"):
        await call_streamed(worker)


def _mid_stream(extra: str) -> ScriptedResponse:
    events = stream_events("Partial answer here.", with_stop=False)
    return ScriptedResponse(events=[*events[:5], extra])


@pytest.mark.parametrize(
    ("extra", "raised"),
    [
        (error_event("overloaded_error", "Overloaded"), ProviderUnavailable),
        (error_event("api_error", "Internal server error"), MalformedResponse),
        ("event: content_block_delta\ndata: {not json\n\n", MalformedResponse),
        (sse("message_delta", {"type": "message_delta", "delta": "stop"}), MalformedResponse),
    ],
)
async def test_error_or_garbage_mid_stream_raises(
    fake: FakeAnthropicServer,
    worker: AnthropicWorker,
    extra: str,
    raised: type[WorkerError],
) -> None:
    fake.enqueue(_mid_stream(extra))

    with pytest.raises(raised) as caught:
        await call_streamed(worker)

    assert type(caught.value) is raised
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("events", "says"),
    [
        (stream_events("Hi")[1:], "message_delta before message_start"),
        ([sse("message_stop", {"type": "message_stop"})], "message_stop without message_start"),
    ],
)
async def test_stream_without_message_start_is_malformed(
    fake: FakeAnthropicServer, worker: AnthropicWorker, events: list[str], says: str
) -> None:
    # message_start carries the input counts: without it the usage would be a guess.
    fake.enqueue(ScriptedResponse(events=events))

    with pytest.raises(MalformedResponse, match=says):
        await call_streamed(worker)


async def test_stream_refused_with_a_status_raises_before_any_event(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    fake.enqueue(error(429, "rate_limit_error", "Slow down.", headers={"retry-after": "2"}))

    with pytest.raises(RateLimited) as caught:
        await call_streamed(worker)

    assert caught.value.retry_after_s == 2.0


# -- configuration and secrets --------------------------------------------------------------


def test_from_spec_refuses_what_it_cannot_call() -> None:
    with pytest.raises(WorkerUnavailable, match=KEY_ENV):
        AnthropicWorker.from_spec(spec("http://127.0.0.1:9"), environ={})
    with pytest.raises(WorkerUnavailable, match="api_key_env"):
        AnthropicWorker.from_spec(spec("http://127.0.0.1:9", api_key_env=None), environ={})
    with pytest.raises(ConfigurationError, match="does not speak"):
        AnthropicWorker.from_spec(
            spec("http://127.0.0.1:9", provider=Provider.OPENAI), environ={KEY_ENV: KEY}
        )


async def test_default_base_url_is_anthropics() -> None:
    adapter = AnthropicWorker.from_spec(spec(None), environ={KEY_ENV: KEY})
    await adapter.aclose()

    assert adapter.url == "https://api.anthropic.com/v1/messages"


@pytest.mark.parametrize("streaming", [False, True])
async def test_the_key_never_shows_in_errors_or_repr(
    fake: FakeAnthropicServer, worker: AnthropicWorker, streaming: bool
) -> None:
    # A careless proxy echoes the key back; neither message nor repr may contain it.
    fake.enqueue(
        ScriptedResponse(status=401, body=f"<html>Invalid x-api-key: {KEY}</html>"),
    )

    with pytest.raises(ProviderAuthError) as caught:
        await (call_streamed(worker) if streaming else call(worker))

    text = f"{caught.value} {caught.value!r} {worker!r}"
    assert KEY not in text
    assert "Invalid x-api-key: ***" in text


async def test_borrowed_client_stays_open(fake: FakeAnthropicServer) -> None:
    async with httpx.AsyncClient() as client:
        adapter = AnthropicWorker.from_spec(spec(fake.base_url), {KEY_ENV: KEY}, client=client)
        await call(adapter)
        await adapter.aclose()

        assert not client.is_closed  # borrowed: its owner closes it


# -- the fake itself: it must refuse what the real API refuses ------------------------------

GOOD_BODY: dict[str, Any] = {
    "model": "claude-fake",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "Hi"}],
}
GOOD_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


@pytest.mark.parametrize(
    ("headers", "body", "status", "type_"),
    [
        (GOOD_HEADERS, GOOD_BODY, 200, "message"),
        ({"anthropic-version": "2023-06-01"}, GOOD_BODY, 401, "authentication_error"),
        ({"x-api-key": KEY}, GOOD_BODY, 400, "invalid_request_error"),
        (GOOD_HEADERS, {**GOOD_BODY, "max_tokens": "16"}, 400, "invalid_request_error"),
        (GOOD_HEADERS, {**GOOD_BODY, "temperature": 1.5}, 400, "invalid_request_error"),
        (
            GOOD_HEADERS,
            {**GOOD_BODY, "messages": [{"role": "system", "content": "x"}]},
            400,
            "invalid_request_error",
        ),
        (
            GOOD_HEADERS,
            {**GOOD_BODY, "messages": [*GOOD_BODY["messages"], {"role": "user", "content": "x"}]},
            400,
            "invalid_request_error",
        ),
    ],
)
async def test_fake_validates_like_the_api(
    fake: FakeAnthropicServer,
    headers: dict[str, str],
    body: dict[str, Any],
    status: int,
    type_: str,
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{fake.base_url}/v1/messages", headers=headers, json=body)

    assert response.status_code == status
    answer = response.json()
    assert (answer.get("error") or answer)["type"] == type_
