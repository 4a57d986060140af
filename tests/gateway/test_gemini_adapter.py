"""Gemini generateContent worker adapter against a fake Gemini server on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from conductor.answer_format import AnswerFormat, AnswerFormatError
from conductor.chat import ChatMessage, Completion, ImagePart, ToolCall, ToolSpec, ToolUse
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
from conductor.ports import ChatWorker, FormattedAnswerWorker, ToolCallingWorker
from conductor.streaming import StreamEnd, TextDelta, collect_stream
from conductor_gateway.providers.gemini import GeminiWorker

from fakes.gemini_server import (
    FakeGeminiServer,
    blocked_body,
    error,
    error_body,
    generated,
    response_body,
    sse,
    stream_events,
    streamed,
)
from fakes.http_server import ScriptedResponse

KEY = "AIza-test-SECRET-0123456789"
KEY_ENV = "GEMINI_TEST_KEY"
QUESTION = [
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Hi"),
]


@pytest.fixture
def fake(fake_gemini: FakeGeminiServer) -> FakeGeminiServer:
    return fake_gemini


def spec(base_url: str | None, **overrides: Any) -> WorkerSpec:
    fields: dict[str, Any] = {
        "name": "gemini",
        "provider": Provider.GEMINI,
        "model": "gemini-2.5-flash",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout_s": 5.0,
    }
    return WorkerSpec(**(fields | overrides))


@pytest.fixture
async def sent_urls() -> AsyncIterator[tuple[httpx.AsyncClient, list[httpx.URL]]]:
    """A client that records every URL it sends, query string included (the fake sees no query)."""
    urls: list[httpx.URL] = []

    async def record(request: httpx.Request) -> None:
        urls.append(request.url)

    async with httpx.AsyncClient(event_hooks={"request": [record]}) as client:
        yield client, urls


Factory = Callable[..., GeminiWorker]


@pytest.fixture
async def make_worker(fake: FakeGeminiServer) -> AsyncIterator[Factory]:
    """Builds workers on the fake with the test key set, and closes them all afterwards."""
    made: list[GeminiWorker] = []

    def make(client: httpx.AsyncClient | None = None, **overrides: Any) -> GeminiWorker:
        worker_spec = spec(fake.base_url, **overrides)
        made.append(GeminiWorker.from_spec(worker_spec, {KEY_ENV: KEY}, client=client))
        return made[-1]

    yield make
    for adapter in made:
        await adapter.aclose()


@pytest.fixture
def worker(make_worker: Factory) -> GeminiWorker:
    return make_worker()


async def call(worker: GeminiWorker, messages: list[ChatMessage] = QUESTION) -> Completion:
    return await worker.complete(messages, max_tokens=64, temperature=0.5)


async def call_stream(worker: GeminiWorker) -> Completion:
    return await collect_stream(
        worker.stream(QUESTION, max_tokens=64, temperature=0.5), worker.provider
    )


# -- request ----------------------------------------------------------------------------------


async def test_request_carries_key_header_model_path_roles_and_config(
    fake: FakeGeminiServer,
    make_worker: Factory,
    sent_urls: tuple[httpx.AsyncClient, list[httpx.URL]],
) -> None:
    client, urls = sent_urls
    worker = make_worker(client)
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="system", content="Answer in French."),
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", content="Salut"),
        ChatMessage(role="user", content="And"),
        ChatMessage(role="user", content="bye?"),
    ]

    result = await call(worker, messages)

    assert result.text == "echo: And\n\nbye?"
    sent = fake.last_request
    assert (sent.method, sent.path) == ("POST", "/v1beta/models/gemini-2.5-flash:generateContent")
    assert sent.headers["x-goog-api-key"] == KEY
    assert "authorization" not in sent.headers
    assert urls[-1].query == b""
    assert KEY not in str(urls[-1])
    assert sent.json == {
        "contents": [
            {"role": "user", "parts": [{"text": "Hi"}]},
            {"role": "model", "parts": [{"text": "Salut"}]},
            {"role": "user", "parts": [{"text": "And\n\nbye?"}]},
        ],
        "systemInstruction": {"parts": [{"text": "Be brief.\n\nAnswer in French."}]},
        "generationConfig": {"maxOutputTokens": 64, "temperature": 0.5},
    }


async def test_no_system_message_sends_no_system_instruction_and_models_prefix_is_not_doubled(
    fake: FakeGeminiServer, make_worker: Factory
) -> None:
    worker = make_worker(model="models/gemini-2.5-pro")

    await call(worker, [ChatMessage(role="user", content="Hi")])

    assert fake.last_request.path == "/v1beta/models/gemini-2.5-pro:generateContent"
    assert "systemInstruction" not in fake.last_request.json


def test_default_base_url_is_googles() -> None:
    worker = GeminiWorker.from_spec(spec(None), {KEY_ENV: KEY})

    assert worker.url == "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"


# -- answers ----------------------------------------------------------------------------------


async def test_default_answer_parses_text_usage_and_model(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    result = await call(worker)

    assert result.text == "echo: Hi"
    assert result.finish_reason == "STOP"
    assert result.model == "gemini-2.5-flash"
    # ceil(len/4) + 4 per content, the system instruction included; the answer is 8 characters.
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3 + 4 + 1 + 4, 2)
    assert isinstance(worker, ChatWorker)


async def test_usage_counts_thoughts_as_output_and_reports_cached_tokens(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    fake.enqueue(
        generated(
            "42",
            thought="Let me add the numbers first.",
            prompt_tokens=100,
            candidates_tokens=3,
            cached_tokens=60,
            thoughts_tokens=20,
        )
    )

    result = await call(worker)

    assert result.text == "42"  # the thought part is not the answer
    assert result.model == "gemini-2.5-flash-fake"
    usage = result.usage
    assert (usage.prompt_tokens, usage.cached_tokens) == (100, 60)
    assert (usage.completion_tokens, usage.reasoning_tokens) == (23, 20)


async def test_absent_counts_are_zero_and_absent_model_version_is_the_configured_model(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    fake.enqueue(
        generated("", finish_reason="MAX_TOKENS", model_version=None, candidates_tokens=None)
    )

    result = await call(worker)

    assert (result.text, result.finish_reason) == ("", "MAX_TOKENS")
    assert result.model == "gemini-2.5-flash"
    assert result.usage.completion_tokens == result.usage.cached_tokens == 0


async def test_max_tokens_spent_thinking_is_an_empty_answer_not_an_error(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    fake.enqueue(
        generated(None, finish_reason="MAX_TOKENS", candidates_tokens=None, thoughts_tokens=64)
    )

    result = await call(worker)

    assert (result.text, result.finish_reason) == ("", "MAX_TOKENS")
    assert result.usage.completion_tokens == 64


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (blocked_body("PROHIBITED_CONTENT"), r"blocked the prompt \(PROHIBITED_CONTENT\)"),
        (response_body(None, finish_reason="SAFETY"), "finishReason SAFETY"),
        (response_body(None, finish_reason="RECITATION"), "finishReason RECITATION"),
    ],
)
async def test_withheld_answer_is_rejected_and_not_retryable(
    fake: FakeGeminiServer, worker: GeminiWorker, body: dict[str, Any], says: str
) -> None:
    fake.enqueue(ScriptedResponse(json=body))

    with pytest.raises(ProviderRejected, match=says) as caught:
        await call(worker)

    assert not caught.value.retryable
    assert "worker 'gemini'" in str(caught.value)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "status_name", "expected", "retryable"),
    [
        (400, "INVALID_ARGUMENT", ProviderRejected, False),
        (403, "PERMISSION_DENIED", ProviderAuthError, False),
        (404, "NOT_FOUND", ProviderRejected, False),
        (500, "INTERNAL", ProviderUnavailable, True),
        (503, "UNAVAILABLE", ProviderUnavailable, True),
        (504, "DEADLINE_EXCEEDED", ProviderUnavailable, True),
    ],
)
async def test_error_statuses_map_onto_the_error_classes(
    fake: FakeGeminiServer,
    worker: GeminiWorker,
    status: int,
    status_name: str,
    expected: type[WorkerError],
    retryable: bool,
) -> None:
    fake.enqueue(error(status, status_name, "The model is overloaded or the request is wrong."))

    with pytest.raises(WorkerError) as caught:
        await call(worker)

    assert type(caught.value) is expected
    assert caught.value.retryable is retryable
    assert caught.value.status_code == status
    assert "The model is overloaded" in str(caught.value)
    assert status_name in str(caught.value)


async def test_429_waits_as_long_as_retry_info_says_without_a_retry_after_header(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    fake.enqueue(error(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", retry_delay="1s"))

    with pytest.raises(RateLimited) as caught:
        await call(worker)

    assert caught.value.retry_after_s == 1.0
    assert caught.value.retryable
    assert "Quota exceeded." in str(caught.value)


async def test_missing_key_is_refused_by_the_fake_like_google_does(fake: FakeGeminiServer) -> None:
    keyless = GeminiWorker(
        name="gemini", model="gemini-2.5-flash", base_url=fake.base_url, api_key=None
    )
    try:
        with pytest.raises(ProviderAuthError, match="PERMISSION_DENIED"):
            await call(keyless)
    finally:
        await keyless.aclose()

    assert "x-goog-api-key" not in fake.last_request.headers


async def test_the_key_never_appears_in_errors_or_repr(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    # A careless proxy echoes the key back; the message must still not contain it.
    fake.enqueue(error(400, "INVALID_ARGUMENT", f"API key not valid: {KEY}."))

    with pytest.raises(ProviderRejected) as caught:
        await call(worker)

    text = f"{caught.value} {caught.value!r} {worker!r}"
    assert KEY not in text
    assert "API key not valid: ***" in text
    assert "gemini-2.5-flash" in repr(worker)


def _with(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return body | changes


def _candidate(**changes: Any) -> dict[str, Any]:
    body = response_body("hi")
    return body | {"candidates": [body["candidates"][0] | changes]}


@pytest.mark.parametrize(
    ("scripted", "says"),
    [
        (ScriptedResponse(body="<html>gateway hiccup</html>"), "not JSON"),
        (ScriptedResponse(json=["not", "an", "object"]), "response must be an object"),
        (ScriptedResponse(json={"modelVersion": "x"}), "'candidates' must be a non-empty list"),
        (ScriptedResponse(json=_with(response_body("hi"), candidates={"0": 1})), "must be a list"),
        (ScriptedResponse(json=_with(response_body("hi"), usageMetadata=None)), "usageMetadata"),
        (
            ScriptedResponse(json=_with(response_body("hi"), usageMetadata={"totalTokenCount": 1})),
            r"promptTokenCount must be a non-negative integer",
        ),
        (
            ScriptedResponse(json=response_body("hi", prompt_tokens=-1)),
            r"promptTokenCount must be a non-negative integer",
        ),
        (ScriptedResponse(json=_candidate(content="hi")), r"content must be an object"),
        (ScriptedResponse(json=_candidate(content={"parts": {"text": "hi"}})), "must be a list"),
        (ScriptedResponse(json=_candidate(content={"parts": [{"text": 7}]})), "text must be a str"),
        (ScriptedResponse(json=_candidate(finishReason=1)), "finishReason must be a string"),
        (ScriptedResponse(json=error_body(500, "INTERNAL", "oops")), "carries an error"),
    ],
)
async def test_malformed_bodies(
    fake: FakeGeminiServer, worker: GeminiWorker, scripted: ScriptedResponse, says: str
) -> None:
    fake.enqueue(scripted)

    with pytest.raises(MalformedResponse, match=says) as caught:
        await call(worker)

    assert "worker 'gemini'" in str(caught.value)


# -- streaming --------------------------------------------------------------------------------


async def test_stream_yields_pieces_then_one_end_with_the_last_usage(
    fake: FakeGeminiServer,
    make_worker: Factory,
    sent_urls: tuple[httpx.AsyncClient, list[httpx.URL]],
) -> None:
    client, urls = sent_urls
    worker = make_worker(client)

    events = [e async for e in worker.stream(QUESTION, max_tokens=64, temperature=0.5)]

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 3
    assert "".join(d.text for d in deltas) == "echo: Hi"
    assert isinstance(events[-1], StreamEnd)
    assert [isinstance(e, StreamEnd) for e in events].count(True) == 1
    assert events[-1].usage.prompt_tokens == 12
    assert events[-1].usage.completion_tokens == 2
    assert (events[-1].finish_reason, events[-1].model) == ("STOP", "gemini-2.5-flash")
    sent = fake.last_request
    assert sent.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    assert sent.headers["x-goog-api-key"] == KEY
    assert urls[-1].params == httpx.QueryParams({"alt": "sse"})
    assert sent.json["generationConfig"] == {"maxOutputTokens": 64, "temperature": 0.5}


async def test_collected_stream_skips_thoughts_and_maps_usage(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    thought = sse(response_body(None, finish_reason=None, thought="Thinking..."))
    events = stream_events(
        "Paris.", prompt_tokens=9, candidates_tokens=2, thoughts_tokens=30, cached_tokens=4
    )
    fake.enqueue(ScriptedResponse(events=[thought, *events]))

    result = await call_stream(worker)

    assert result.text == "Paris."
    assert result.usage.prompt_tokens == 9
    assert result.usage.cached_tokens == 4
    assert (result.usage.completion_tokens, result.usage.reasoning_tokens) == (32, 30)
    assert result.model == "gemini-2.5-flash-fake"


async def test_stream_cut_midway_is_interrupted_and_returns_no_partial_text(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    fake.enqueue(streamed("A long answer that breaks off", cut_after=2))
    seen: list[str] = []

    async def consume() -> None:
        async for event in worker.stream(QUESTION, max_tokens=64, temperature=0.5):
            assert isinstance(event, TextDelta), "a cut stream must not end cleanly"
            seen.append(event.text)

    with pytest.raises(StreamInterrupted) as caught:
        await consume()

    assert len(seen) == 2  # the pieces before the cut, never passed off as an answer
    assert caught.value.retryable


async def test_stream_that_closes_without_a_finish_reason_is_interrupted(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    fake.enqueue(streamed("Half an answer", with_finish=False))

    with pytest.raises(StreamInterrupted, match="without its end marker"):
        await call_stream(worker)


async def test_stream_that_finishes_without_usage_is_malformed(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    chunk = response_body("Done.")
    del chunk["usageMetadata"]
    fake.enqueue(ScriptedResponse(events=[sse(chunk)]))

    with pytest.raises(MalformedResponse, match="without usageMetadata"):
        await call_stream(worker)


@pytest.mark.parametrize(
    ("status", "status_name", "expected", "retry_after_s"),
    [
        (503, "UNAVAILABLE", ProviderUnavailable, None),
        (429, "RESOURCE_EXHAUSTED", RateLimited, 2.0),
        (400, "INVALID_ARGUMENT", MalformedResponse, None),
    ],
)
async def test_error_object_inside_the_stream_raises(
    fake: FakeGeminiServer,
    worker: GeminiWorker,
    status: int,
    status_name: str,
    expected: type[WorkerError],
    retry_after_s: float | None,
) -> None:
    first = stream_events("Hello there", with_finish=False)[0]
    failure = sse(error_body(status, status_name, f"Stream failed; key {KEY}", "2s"))
    fake.enqueue(ScriptedResponse(events=[first, failure]))

    with pytest.raises(WorkerError) as caught:
        await call_stream(worker)

    assert type(caught.value) is expected
    assert caught.value.retryable  # all three: another try may succeed
    assert caught.value.retry_after_s == retry_after_s
    assert caught.value.status_code == status
    assert "error inside the stream: Stream failed" in str(caught.value)
    assert KEY not in str(caught.value)


@pytest.mark.parametrize(
    ("events", "says"),
    [
        ([sse(blocked_body("SAFETY"))], "blocked the prompt"),
        ([sse(response_body(None, finish_reason="SAFETY"))], "withheld"),
    ],
)
async def test_withheld_stream_is_rejected(
    fake: FakeGeminiServer, worker: GeminiWorker, events: list[str], says: str
) -> None:
    fake.enqueue(ScriptedResponse(events=events))

    with pytest.raises(ProviderRejected, match=says) as caught:
        await call_stream(worker)

    assert not caught.value.retryable


async def test_bad_stream_chunk_is_malformed(fake: FakeGeminiServer, worker: GeminiWorker) -> None:
    fake.enqueue(ScriptedResponse(events=["data: {not json\r\n\r\n"]))

    with pytest.raises(MalformedResponse, match="worker 'gemini': stream chunk is not JSON"):
        await call_stream(worker)


# -- construction -----------------------------------------------------------------------------


def test_from_spec_refuses_what_it_cannot_call() -> None:
    with pytest.raises(WorkerUnavailable, match=KEY_ENV):
        GeminiWorker.from_spec(spec("http://127.0.0.1:9"), environ={})
    with pytest.raises(WorkerUnavailable, match="needs api_key_env"):
        GeminiWorker.from_spec(spec("http://127.0.0.1:9", api_key_env=None), environ={})
    with pytest.raises(ConfigurationError, match="does not speak"):
        GeminiWorker.from_spec(spec("http://x", provider=Provider.OPENAI), {KEY_ENV: KEY})


async def test_borrowed_client_stays_open(fake: FakeGeminiServer) -> None:
    async with httpx.AsyncClient() as client:
        adapter = GeminiWorker.from_spec(spec(fake.base_url), {KEY_ENV: KEY}, client=client)
        await call(adapter)
        await adapter.aclose()

        assert not client.is_closed  # borrowed: its owner closes it
    assert KEY not in repr(adapter)


# -- function calling -------------------------------------------------------------------------

# Written for OpenAI's strict mode: Gemini's OpenAPI-subset ``parameters`` would refuse
# ``additionalProperties`` and ``$schema``; ``parametersJsonSchema`` takes them.
WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters={
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    strict=True,
)
TIME = ToolSpec(name="get_time", parameters={"type": "object", "properties": {}})
PARIS = '{"city": "Paris"}'


def tools(choice: str = "auto") -> ToolUse:
    return ToolUse(tools=(WEATHER, TIME), choice=choice, parallel=False)


async def call_with_tools(
    worker: GeminiWorker, messages: list[ChatMessage] = QUESTION, choice: str = "auto"
) -> Completion:
    return await worker.complete_with_tools(messages, tools(choice), max_tokens=64, temperature=0.5)


def asked(*calls: ToolCall) -> ChatMessage:
    return ChatMessage(role="assistant", content="", tool_calls=calls)


def result(call_id: str, content: str) -> ChatMessage:
    return ChatMessage(role="tool", content=content, tool_call_id=call_id)


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        ("auto", {"mode": "AUTO"}),
        ("none", {"mode": "NONE"}),
        ("required", {"mode": "ANY"}),
        ("get_time", {"mode": "ANY", "allowedFunctionNames": ["get_time"]}),
    ],
)
async def test_tools_go_as_function_declarations_and_the_choice_as_a_calling_mode(
    fake: FakeGeminiServer, worker: GeminiWorker, choice: str, config: dict[str, Any]
) -> None:
    # Given tools with a full JSON Schema, strict and parallel set (neither has a Gemini twin)
    # When the worker is called with them (the fake refuses what Google would)
    await call_with_tools(worker, choice=choice)

    # Then the schema travels untouched as parametersJsonSchema, the choice as the mode
    sent = fake.last_request.json
    assert sent["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "parametersJsonSchema": WEATHER.parameters,
                },
                {"name": "get_time", "parametersJsonSchema": TIME.parameters},
            ]
        }
    ]
    assert sent["toolConfig"] == {"functionCallingConfig": config}
    assert "strict" not in json.dumps(sent)
    assert "parallel" not in json.dumps(sent)


async def test_a_required_call_comes_back_as_tool_calls_from_the_default_fake(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    # Given the fake, which answers mode ANY with a call to the first allowed function
    # When a call of get_time is required
    answer = await call_with_tools(worker, choice="get_time")

    # Then that call is the answer
    assert (answer.text, answer.finish_reason) == ("", "tool_calls")
    assert [(c.name, c.arguments) for c in answer.tool_calls] == [("get_time", "{}")]


@pytest.mark.parametrize("offered", [True, False], ids=["tools offered", "tools no more"])
async def test_calls_and_results_in_the_history_go_as_function_call_and_response_parts(
    fake: FakeGeminiServer, worker: GeminiWorker, offered: bool
) -> None:
    # Given a history where the model called two functions and got both results, then the
    # user spoke again (Gemini names a result by its function, and wants roles to alternate)
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather and time in Paris?"),
        asked(
            ToolCall(id="call_a", name="get_weather", arguments=PARIS),
            ToolCall(id="call_b", name="get_time", arguments=""),
        ),
        result("call_b", '{"time": "14:00"}'),
        result("call_a", "18 C"),
        ChatMessage(role="user", content="And in Oslo?"),
        ChatMessage(
            role="assistant",
            content="Checking.",
            tool_calls=(ToolCall(id="call_a", name="get_time", arguments='{"city": "Oslo"}'),),
        ),
        result("call_a", "15:00"),
    ]

    # When the worker is called with it, with tools or (a client done calling) without
    if offered:
        await call_with_tools(worker, messages)
    else:
        await call(worker, messages)

    # Then calls are functionCall parts of "model" turns and results one "user" turn of
    # functionResponse parts, named after the latest call with their id, texts whole
    sent = fake.last_request.json
    assert sent["contents"] == [
        {"role": "user", "parts": [{"text": "Weather and time in Paris?"}]},
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                {"functionCall": {"name": "get_time", "args": {}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "get_time",
                        "response": {"output": '{"time": "14:00"}'},
                    }
                },
                {"functionResponse": {"name": "get_weather", "response": {"output": "18 C"}}},
                {"text": "And in Oslo?"},
            ],
        },
        {
            "role": "model",
            "parts": [
                {"text": "Checking."},
                {"functionCall": {"name": "get_time", "args": {"city": "Oslo"}}},
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "get_time", "response": {"output": "15:00"}}}],
        },
    ]
    assert sent["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert ("tools" in sent) is offered


async def test_an_answer_of_calls_is_read_into_tool_calls_finishing_tool_calls(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    # Given an answer of text and two calls: one without an id (Gemini's usual), one with
    body = response_body(
        "Let me look.",
        calls=[
            {"name": "get_weather", "args": {"city": "Oslo"}},
            {"name": "get_time", "id": "fc-7"},
        ],
        candidates_tokens=12,
    )
    fake.enqueue(ScriptedResponse(json=body))

    # When the worker is called with tools
    answer = await call_with_tools(worker)

    # Then both calls come back, the first with an id made from the response's, unique
    # across answers; the text is kept and the finish reason is OpenAI's "tool_calls"
    assert answer.tool_calls == (
        ToolCall(
            id=f"call_{body['responseId']}_0", name="get_weather", arguments='{"city": "Oslo"}'
        ),
        ToolCall(id="fc-7", name="get_time", arguments="{}"),
    )
    assert (answer.text, answer.finish_reason) == ("Let me look.", "tool_calls")
    assert answer.usage.completion_tokens == 12


async def test_an_answer_without_a_response_id_numbers_its_calls(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    body = response_body(None, calls=[{"name": "get_time"}, {"name": "get_time"}])
    del body["responseId"]
    fake.enqueue(ScriptedResponse(json=body))

    answer = await call_with_tools(worker)

    assert [c.id for c in answer.tool_calls] == ["call_0", "call_1"]


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("{'city': 'Paris'}", r"arguments of 'get_weather' is not JSON \(Expecting property"),
        ('["Paris"]', "arguments of 'get_weather' must be a JSON object for Gemini, got list"),
    ],
)
async def test_arguments_that_are_no_json_object_are_rejected_before_anything_is_sent(
    fake: FakeGeminiServer, worker: GeminiWorker, arguments: str, says: str
) -> None:
    # Given a history whose call's arguments Gemini cannot take as an object
    messages = [*QUESTION, asked(ToolCall(id="c1", name="get_weather", arguments=arguments))]

    # When the worker is called with it
    with pytest.raises(ProviderRejected, match=says) as caught:
        await call_with_tools(worker, messages)

    # Then the error names the worker and the message, is not retried, and nothing was sent
    assert str(caught.value).startswith("worker 'gemini': messages[2].tool_calls[0].arguments")
    assert not caught.value.retryable
    assert caught.value.status_code is None
    assert fake.requests == []


@pytest.mark.parametrize("offered", [True, False], ids=["tools offered", "tools no more"])
async def test_a_result_whose_call_is_not_in_the_history_is_rejected(
    fake: FakeGeminiServer, worker: GeminiWorker, offered: bool
) -> None:
    # Given a result answering a call no earlier assistant turn made (Gemini needs its name)
    messages = [
        *QUESTION,
        asked(ToolCall(id="c1", name="get_weather", arguments=PARIS)),
        result("c2", "18 C"),
    ]

    # When the worker is called with it, with tools or without
    with pytest.raises(ProviderRejected) as caught:
        await (call_with_tools(worker, messages) if offered else call(worker, messages))

    # Then the error says which result and why, and nothing was sent
    assert str(caught.value).startswith(
        "worker 'gemini': messages[3].tool_call_id 'c2' answers no tool call"
    )
    assert not caught.value.retryable
    assert fake.requests == []


def _answer_part(part: dict[str, Any]) -> ScriptedResponse:
    return ScriptedResponse(json=_candidate(content={"parts": [part]}))


@pytest.mark.parametrize(
    ("scripted", "says"),
    [
        (_answer_part({"functionCall": "get_time()"}), r"parts\[0\]\.functionCall must be an obj"),
        (_answer_part({"functionCall": {"args": {}}}), "name must be a non-empty string, got null"),
        (_answer_part({"functionCall": {"name": "f", "args": "[1]"}}), "args must be an object"),
        (_answer_part({"functionCall": {"name": "f", "id": 7}}), "id must be a string, got int"),
        (
            ScriptedResponse(
                json=response_body("I will call", finish_reason="MALFORMED_FUNCTION_CALL")
            ),
            "function call was unusable",
        ),
    ],
)
async def test_a_malformed_function_call_is_a_malformed_response(
    fake: FakeGeminiServer, worker: GeminiWorker, scripted: ScriptedResponse, says: str
) -> None:
    fake.enqueue(scripted)

    with pytest.raises(MalformedResponse, match=says) as caught:
        await call_with_tools(worker)

    assert caught.value.retryable  # another sample may well make a whole call
    assert "worker 'gemini'" in str(caught.value)


def test_the_worker_takes_tools(worker: GeminiWorker) -> None:
    assert isinstance(worker, ToolCallingWorker)  # the gateway sends tools to such workers


# -- structured output ------------------------------------------------------------------------

# JSON Schema as clients write it, with keywords Gemini's OpenAPI-style responseSchema refuses.
FORECAST: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "high": {"type": ["number", "null"], "minimum": -90},
        "sky": {"anyOf": [{"type": "string", "enum": ["clear", "cloudy"]}, {"type": "null"}]},
    },
    "required": ["city", "high"],
    "additionalProperties": False,
}
IN_SCHEMA = AnswerFormat(type="json_schema", name="forecast", json_schema=FORECAST)
AN_OBJECT = AnswerFormat(type="json_object")


def told(answer_format: AnswerFormat) -> list[ChatMessage]:
    """QUESTION with the answer format's instruction, as the caller writes it into the prompt."""
    return [*QUESTION, ChatMessage(role="system", content=answer_format.instruction())]


async def call_in_format(worker: GeminiWorker, answer_format: AnswerFormat) -> Completion:
    return await worker.complete_in_format(
        told(answer_format), answer_format, max_tokens=64, temperature=0.5
    )


@pytest.mark.parametrize(
    ("answer_format", "config"),
    [
        (AN_OBJECT, {"responseMimeType": "application/json"}),
        (
            IN_SCHEMA,
            {"responseMimeType": "application/json", "responseJsonSchema": FORECAST},
        ),
    ],
    ids=["json_object", "json_schema"],
)
async def test_a_json_answer_goes_as_the_response_mime_type_and_json_schema(
    fake: FakeGeminiServer,
    worker: GeminiWorker,
    answer_format: AnswerFormat,
    config: dict[str, Any],
) -> None:
    # When the worker is asked for an answer in a format
    result = await call_in_format(worker, answer_format)

    # Then generationConfig carries it beside the sampling fields (the schema whole, in the
    # JSON Schema field: no responseSchema), and the fake answers with JSON that follows it
    assert isinstance(worker, FormattedAnswerWorker)
    sent = fake.last_request
    assert sent.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert sent.json["generationConfig"] == {"maxOutputTokens": 64, "temperature": 0.5} | config
    assert "responseSchema" not in sent.json["generationConfig"]
    assert json.loads(answer_format.conform(result.text)) == json.loads(result.text)


async def test_a_model_that_ignores_the_prompts_instruction_answers_json_when_asked_natively(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    # Given a model that answers in prose whatever the prompt says, unless the request asks for
    # JSON natively
    fake.prose_unless_asked_natively = True
    messages = told(IN_SCHEMA)

    # When it is called plainly, then in the schema
    plain = await call(worker, messages)
    formatted = await call_in_format(worker, IN_SCHEMA)

    # Then the plain answer cannot be made JSON, and the one asked natively follows the schema
    with pytest.raises(AnswerFormatError):
        IN_SCHEMA.conform(plain.text)
    assert "generationConfig" in fake.requests[-2].json
    assert "responseMimeType" not in fake.requests[-2].json["generationConfig"]
    assert json.loads(IN_SCHEMA.conform(formatted.text)) == {
        "city": "x",
        "high": -90,
        "sky": "clear",
    }


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"responseJsonSchema": {"type": "object"}}, "required with response_json_schema"),
        (
            {
                "responseMimeType": "application/json",
                "responseSchema": {"type": "OBJECT"},
                "responseJsonSchema": {"type": "object"},
            },
            "exclusive",
        ),
        ({"responseMimeType": "application/xml"}, "unsupported mime type"),
    ],
)
async def test_the_fake_refuses_response_formats_google_refuses(
    fake: FakeGeminiServer, config: dict[str, Any], says: str
) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}], "generationConfig": config}

    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{fake.base_url}/v1beta/models/gemini-2.5-flash:generateContent",
            json=body,
            headers={"x-goog-api-key": KEY},
        )

    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert says in response.json()["error"]["message"]


# -- images -----------------------------------------------------------------------------------

PIXEL = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PNG = ImagePart(url=f"data:image/png;base64,{PIXEL}")
INLINE_PNG = {"inlineData": {"mimeType": "image/png", "data": PIXEL}}


def showing(text: str, *images: ImagePart) -> ChatMessage:
    return ChatMessage(role="user", content=text, images=images)


@pytest.mark.parametrize(
    ("media_type", "sent_as"),
    [("image/png", "image/png"), ("image/JPG", "image/jpeg"), ("image/heic", "image/heic")],
)
async def test_a_data_url_goes_as_inline_data_before_its_text(
    fake: FakeGeminiServer, worker: GeminiWorker, media_type: str, sent_as: str
) -> None:
    # Given a user turn showing one image as a data URL (its type in any case, jpg for JPEG)
    image = ImagePart(url=f"data:{media_type};base64,{PIXEL}", detail="high")

    # When the worker is called with it
    answer = await call(worker, [showing("What is this?", image)])

    # Then the image goes as inlineData, before the text (Gemini's tip for one image with
    # text), its type as Gemini names it; OpenAI's detail has no Gemini twin and is not sent
    assert fake.last_request.json["contents"] == [
        {
            "role": "user",
            "parts": [
                {"inlineData": {"mimeType": sent_as, "data": PIXEL}},
                {"text": "What is this?"},
            ],
        }
    ]
    assert answer.text == "echo: What is this?"


async def test_several_images_follow_the_text_and_an_https_url_goes_as_file_data_streamed(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    # Given a turn asking about two images, one inline, one at a pre-signed https URL
    signed = ImagePart(url="https://bucket.example/shots/b.JPEG?X-Amz-Signature=abc")
    messages = [*QUESTION[:1], showing("What differs?", PNG, signed)]

    # When the answer is streamed
    answer = await collect_stream(
        worker.stream(messages, max_tokens=64, temperature=0.5), worker.provider
    )

    # Then the text leads (as in Gemini's multi-image example) and the URL goes as fileData,
    # for Gemini to fetch, typed by its extension (fileData needs a mimeType)
    sent = fake.last_request
    assert sent.path.endswith(":streamGenerateContent")
    assert sent.json["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "What differs?"},
                INLINE_PNG,
                {"fileData": {"mimeType": "image/jpeg", "fileUri": signed.url}},
            ],
        }
    ]
    assert answer.text == "echo: What differs?"


async def test_images_after_tool_results_join_their_user_turn_behind_the_results(
    fake: FakeGeminiServer, worker: GeminiWorker
) -> None:
    # Given a history where a function's result came back, then the user showed a photo with
    # a question, then another photo without a word
    messages = [
        showing("Weather in Paris?"),
        asked(ToolCall(id="call_a", name="get_weather", arguments=PARIS)),
        result("call_a", "18 C"),
        showing("Does this photo match?", PNG),
        showing("", ImagePart(url="https://example.com/sky.webp")),
    ]

    # When the worker is called with tools
    await call_with_tools(worker, messages)

    # Then the result keeps its place at the head of the one "user" turn, each image comes
    # before its text, and an image shown alone sends no empty text
    assert fake.last_request.json["contents"][-1] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "get_weather", "response": {"output": "18 C"}}},
            INLINE_PNG,
            {"text": "Does this photo match?"},
            {"fileData": {"mimeType": "image/webp", "fileUri": "https://example.com/sky.webp"}},
        ],
    }


async def call_by(how: str, worker: GeminiWorker, messages: list[ChatMessage]) -> Completion:
    if how == "stream":
        stream = worker.stream(messages, max_tokens=64, temperature=0.5)
        return await collect_stream(stream, worker.provider)
    return await (call_with_tools(worker, messages) if how == "tools" else call(worker, messages))


@pytest.mark.parametrize("how", ["complete", "stream", "tools"])
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("data:image/gif;base64,R0lGODlhAQABAAAAACw=", "is image/gif: Gemini takes PNG, JPEG"),
        ("data:image/svg+xml;base64,PHN2Zy8+", r"is image/svg\+xml: Gemini takes PNG"),
        ("data:image/png,rawbytes", "is not a base64 data URL"),
        ("http://example.com/cat.png", "is not an https URL: Gemini fetches images only over"),
        ("https://example.com/cat?id=7", "type cannot be told from its URL's extension"),
        ("https://example.com/cat.gif", "links to image/gif: Gemini fetches PNG, JPEG, WEBP or"),
        ("https://example.com/cat.heic", "links to image/heic"),  # inline only
    ],
)
async def test_an_image_gemini_would_refuse_fails_before_anything_is_sent(
    fake: FakeGeminiServer, worker: GeminiWorker, how: str, url: str, says: str
) -> None:
    # Given a user turn showing an image Gemini does not take that way
    messages = [*QUESTION, showing("And this?", PNG, ImagePart(url=url))]

    # When the worker is called, streamed or offered tools
    with pytest.raises(ProviderRejected, match=says) as caught:
        await call_by(how, worker, messages)

    # Then the error names the worker and the image, is not retried, and nothing was sent
    assert str(caught.value).startswith("worker 'gemini': messages[2].images[1]")
    assert not caught.value.retryable
    assert caught.value.status_code is None
    assert fake.requests == []


async def test_a_gemini_2_0_model_is_sent_images_inline_only(
    fake: FakeGeminiServer, make_worker: Factory
) -> None:
    # Given a Gemini 2.0 model, which fetches no external URLs
    worker = make_worker(model="models/gemini-2.0-flash")

    # When it is shown an image by URL, then one inline
    with pytest.raises(
        ProviderRejected, match=r"messages\[0\]\.images\[0\] is a URL, which Gemini 2\.0"
    ):
        await call(worker, [showing("What is this?", ImagePart(url="https://example.com/a.png"))])
    await call(worker, [showing("What is this?", PNG)])

    # Then only the inline one was sent
    assert [r.json["contents"][0]["parts"][0] for r in fake.requests] == [INLINE_PNG]


@pytest.mark.parametrize(
    ("model", "part", "says"),
    [
        ("gemini-2.5-flash", {"inlineData": {"mimeType": "image/gif", "data": PIXEL}}, "MIME"),
        ("gemini-2.5-flash", {"inlineData": {"mimeType": "image/png", "data": "no!"}}, "Base64"),
        ("gemini-2.5-flash", {"fileData": {"fileUri": "http://example.com/a.png"}}, "file uri"),
        ("gemini-2.5-flash", {"fileData": {"fileUri": "https://example.com/a"}}, "MIME type"),
        (
            "gemini-2.0-flash",
            {"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/a.png"}},
            "not supported for this model",
        ),
    ],
)
async def test_the_fake_refuses_image_parts_google_refuses(
    fake: FakeGeminiServer, model: str, part: dict[str, Any], says: str
) -> None:
    # Given an image part Gemini refuses, sent past the adapter's own checks
    body = {"contents": [{"role": "user", "parts": [part, {"text": "What is this?"}]}]}

    # When it reaches the fake
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{fake.base_url}/v1beta/models/{model}:generateContent",
            json=body,
            headers={"x-goog-api-key": KEY},
        )

    # Then it is a 400 INVALID_ARGUMENT, as from Google, so adapter tests cannot pass on a
    # request Google would refuse
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert says in response.json()["error"]["message"]
