"""The Anthropic Messages API worker adapter against a fake Anthropic server on loopback."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

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
from conductor.streaming import StreamEnd, StreamEvent, TextDelta, collect_stream
from conductor_gateway.providers.anthropic import AnthropicWorker
from conductor_gateway.retry import RetryPolicy

from fakes.anthropic_server import (
    FakeAnthropicServer,
    error,
    error_event,
    message,
    message_body,
    sse,
    stream_events,
    streamed,
    tool_use_block,
    tool_use_body,
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


# -- function calling ----------------------------------------------------------------------

WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    strict=True,  # OpenAI's; the Messages API would refuse it
)
CLOCK = ToolSpec(name="get_time")  # no description, no parameters
TOOLS = ToolUse(tools=(WEATHER, CLOCK))


def called(ident: str, city: str) -> ToolCall:
    return ToolCall(id=ident, name="get_weather", arguments=json.dumps({"city": city}))


async def call_with_tools(
    worker: AnthropicWorker, messages: list[ChatMessage] = QUESTION, tools: ToolUse = TOOLS
) -> Completion:
    return await worker.complete_with_tools(messages, tools, max_tokens=64, temperature=0.5)


async def test_tools_go_with_input_schema_and_no_openai_fields(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given a tool with parameters and strict, and one with neither

    # When the worker is called with them
    result = await call_with_tools(worker)

    # Then each has the required input_schema (an empty object for none) and no strict, and
    # the fake, which refuses unknown fields as the API does, answers
    assert isinstance(worker, ToolCallingWorker)
    assert (result.text, result.finish_reason, result.tool_calls) == ("echo: Hi", "end_turn", ())
    sent = fake.last_request.json
    assert sent["tools"] == [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert "stream" not in sent  # a whole call: the calls come back in one answer


@pytest.mark.parametrize(
    ("choice", "parallel", "sent"),
    [
        ("auto", None, {"type": "auto"}),
        ("auto", False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", True, {"type": "any"}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (
            "get_weather",
            False,
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
        ("none", False, {"type": "none"}),  # ToolChoiceNone takes no other field
    ],
)
async def test_tool_choice_and_parallel_calls_map_onto_tool_choice(
    fake: FakeAnthropicServer,
    worker: AnthropicWorker,
    choice: str,
    parallel: bool | None,
    sent: dict[str, Any],
) -> None:
    # Given a choice of OpenAI's and whether calls may go in parallel
    tools = ToolUse(tools=(WEATHER,), choice=choice, parallel=parallel)

    # When the worker is called with them
    await call_with_tools(worker, tools=tools)

    # Then both travel in Anthropic's one tool_choice object
    assert fake.last_request.json["tool_choice"] == sent
    assert "parallel_tool_calls" not in fake.last_request.json


async def test_calls_and_results_are_blocks_in_alternating_turns(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given a transcript with two rounds of calls: two calls in parallel with some text, whose
    # results come as two tool messages and a user message; then one call alone
    transcript = [
        *QUESTION,
        ChatMessage(
            role="assistant",
            content="Checking both.",
            tool_calls=(called("toolu_1", "Paris"), called("toolu_2", "Rome")),
        ),
        ChatMessage(role="tool", content="18 C", tool_call_id="toolu_1"),
        ChatMessage(role="tool", content="24 C", tool_call_id="toolu_2"),
        ChatMessage(role="user", content="And Oslo?"),
        ChatMessage(role="assistant", content="", tool_calls=(called("toolu_3", "Oslo"),)),
        ChatMessage(role="tool", content="9 C", tool_call_id="toolu_3"),
    ]

    # When the worker is called with it
    result = await call_with_tools(worker, transcript)

    # Then calls are tool_use blocks after the turn's text; results open one user turn each
    # round, before the user's text; and the fake, which checks the pairing, reads them
    assert result.text == "echo: 9 C"
    sent = fake.last_request.json
    assert sent["system"] == "Be brief."
    assert sent["messages"] == [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking both."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "24 C"},
                {"type": "text", "text": "And Oslo?"},
            ],
        },
        {
            "role": "assistant",  # no text block: the API refuses a blank one
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_3",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_3", "content": "9 C"}],
        },
    ]


async def test_without_tools_calls_and_results_are_text(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given a transcript with a call and its result, sent on a plain call (no tools): the API
    # refuses tool blocks in a request that defines no tools
    transcript = [
        *QUESTION,
        ChatMessage(role="assistant", content="", tool_calls=(called("toolu_1", "Paris"),)),
        ChatMessage(role="tool", content="18 C", tool_call_id="toolu_1"),
    ]

    # When the worker is called with it
    await call(worker, transcript)

    # Then the call and its result are read as conversation
    assert fake.last_request.json["messages"][1:] == [
        {"role": "assistant", "content": '[called get_weather({"city": "Paris"})]'},
        {"role": "user", "content": "Tool result (toolu_1): 18 C"},
    ]


async def test_a_tool_use_answer_is_read_as_tool_calls(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given an answer with some text and two tool_use blocks
    fake.enqueue(
        ScriptedResponse(
            json=tool_use_body(
                [
                    tool_use_block("toolu_7", "get_weather", {"city": "Oslo", "days": 2}),
                    tool_use_block("toolu_8", "get_time", {}),
                ],
                text="Let me look.",
            )
        )
    )

    # When the worker is called with tools
    result = await call_with_tools(worker)

    # Then the blocks are the calls, their input as JSON text, and the stop is OpenAI's
    assert result.text == "Let me look."
    assert result.finish_reason == "tool_calls"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("toolu_7", "get_weather", {"city": "Oslo", "days": 2}),
        ("toolu_8", "get_time", {}),
    ]


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ('{"city": "Par', "arguments are not JSON"),
        ('["Paris"]', "must be a JSON object, got list"),
        ('"Paris"', "must be a JSON object, got str"),
    ],
)
async def test_arguments_that_are_not_a_json_object_are_refused_before_sending(
    fake: FakeAnthropicServer, worker: AnthropicWorker, arguments: str, says: str
) -> None:
    # Given an earlier call whose arguments Anthropic cannot take as its input object
    bad = ToolCall(id="toolu_1", name="get_weather", arguments=arguments)
    transcript = [
        *QUESTION,
        ChatMessage(role="assistant", content="", tool_calls=(bad,)),
        ChatMessage(role="tool", content="18 C", tool_call_id="toolu_1"),
    ]

    # When the worker is called with it
    with pytest.raises(ProviderRejected, match=says) as caught:
        await call_with_tools(worker, transcript)

    # Then nothing is sent, the error names the worker and the call, and the gateway does not
    # send the same request again
    assert fake.message_requests == []
    assert type(caught.value) is ProviderRejected
    assert "worker 'claude': messages[2].tool_calls[0] ('get_weather'" in str(caught.value)
    assert not RetryPolicy().should_retry(caught.value, 1)


async def test_blank_arguments_are_a_call_without_arguments(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given an earlier call with blank arguments, as some OpenAI-compatible servers write them
    transcript = [
        *QUESTION,
        ChatMessage(
            role="assistant",
            content="",
            tool_calls=(ToolCall(id="t1", name="get_time", arguments=""),),
        ),
        ChatMessage(role="tool", content="noon", tool_call_id="t1"),
    ]

    # When the worker is called with it
    await call_with_tools(worker, transcript)

    # Then its input is an empty object
    assert fake.last_request.json["messages"][1]["content"][0]["input"] == {}


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ({"type": "tool_use", "name": "get_time", "input": {}}, "needs a string id"),
        ({"type": "tool_use", "id": "t1", "name": 3, "input": {}}, "needs a string id and name"),
        ({"type": "tool_use", "id": "t1", "name": "get_time", "input": "{}"}, "an input object"),
        ({"type": "tool_use", "id": "", "name": "get_time", "input": {}}, "at least 1 character"),
    ],
)
async def test_a_malformed_tool_use_block_is_a_malformed_response(
    fake: FakeAnthropicServer, worker: AnthropicWorker, block: dict[str, Any], says: str
) -> None:
    # Given an answer whose tool_use block is off the documented format
    fake.enqueue(ScriptedResponse(json=tool_use_body([block])))

    # When the worker is called with tools
    with pytest.raises(MalformedResponse, match=says) as caught:
        await call_with_tools(worker)

    # Then it is a malformed answer naming its block, which the gateway may try again
    assert "content[0] (tool_use)" in str(caught.value)
    assert caught.value.retryable


# -- images --------------------------------------------------------------------------------

# A PNG's signature: the fake only decodes the base64, it never looks at the picture.
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
PHOTO_URL = "https://example.com/cat.jpg"
Mode = Literal["complete", "stream", "tools"]
MODES: tuple[Mode, ...] = ("complete", "stream", "tools")


def data_url(media_type: str, data: str = PNG) -> ImagePart:
    return ImagePart(url=f"data:{media_type};base64,{data}")


def png_block(media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": PNG}}


def url_block(url: str = PHOTO_URL) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "url", "url": url}}


async def call_in(mode: Mode, worker: AnthropicWorker, messages: list[ChatMessage]) -> Completion:
    """One call the way ``mode`` names: images are not tool-only, so every way takes them."""
    if mode == "stream":
        return await collect_stream(worker.stream(messages, max_tokens=64, temperature=0.5), "x")
    if mode == "tools":
        return await call_with_tools(worker, messages)
    return await call(worker, messages)


@pytest.mark.parametrize("mode", MODES)
async def test_images_go_before_their_text_as_base64_and_url_blocks(
    fake: FakeAnthropicServer, worker: AnthropicWorker, mode: Mode
) -> None:
    # Given a user message showing a PNG data URL and an http URL (with OpenAI's detail)
    shown = (data_url("image/png"), ImagePart(url=PHOTO_URL, detail="high"))
    transcript = [QUESTION[0], ChatMessage(role="user", content="What is this?", images=shown)]

    # When the worker is called with it, whole, streamed or with tools
    result = await call_in(mode, worker, transcript)

    # Then the data URL is a base64 source and the URL a url source, in the order shown, both
    # before the text (the vision docs' image-then-text), no detail; and the fake reads them
    assert result.text == "echo: What is this?"
    assert fake.last_request.json["messages"] == [
        {
            "role": "user",
            "content": [png_block(), url_block(), {"type": "text", "text": "What is this?"}],
        }
    ]


async def test_each_merged_user_message_shows_its_images_before_its_own_text(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given consecutive user messages, one of images alone, merged into one user turn; one
    # media type written in capitals (media types are case-insensitive)
    transcript = [
        ChatMessage(role="user", content="The first.", images=(data_url("image/gif"),)),
        ChatMessage(role="user", content="The second.", images=(data_url("image/WEBP"),)),
        ChatMessage(role="user", content="", images=(ImagePart(url="http://example.com/c"),)),
        ChatMessage(role="user", content="Which is largest?"),
    ]

    # When the worker is called with them
    await call(worker, transcript)

    # Then each message's images come just before its text, and an image-only message adds
    # no text block
    assert fake.last_request.json["messages"] == [
        {
            "role": "user",
            "content": [
                png_block("image/gif"),
                {"type": "text", "text": "The first."},
                png_block("image/webp"),
                {"type": "text", "text": "The second."},
                url_block("http://example.com/c"),
                {"type": "text", "text": "Which is largest?"},
            ],
        }
    ]


async def test_images_follow_the_tool_results_that_open_their_user_turn(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given a call's result followed by a user message with text and an image: one user turn
    transcript = [
        *QUESTION,
        ChatMessage(role="assistant", content="", tool_calls=(called("toolu_1", "Paris"),)),
        ChatMessage(role="tool", content="18 C", tool_call_id="toolu_1"),
        ChatMessage(role="user", content="Is this Paris?", images=(ImagePart(url=PHOTO_URL),)),
    ]

    # When the worker is called with tools
    result = await call_with_tools(worker, transcript)

    # Then the result still opens the turn (the fake refuses any block before it), then the
    # image, then the text it concerns
    assert result.finish_reason == "end_turn"
    assert fake.last_request.json["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            url_block(),
            {"type": "text", "text": "Is this Paris?"},
        ],
    }


@pytest.mark.parametrize(
    ("image", "says"),
    [
        (data_url("image/bmp"), "image/jpeg, image/png, image/gif, image/webp, not 'image/bmp'"),
        (data_url("image/svg+xml"), "not 'image/svg\\+xml'"),
        (ImagePart(url="data:;base64,iVBO"), r"not '\(none\)'"),
        (ImagePart(url="data:image/png,%89PNG"), "the data URL is not base64"),
        (data_url("image/png", "not base64!"), "the data URL is not base64"),
        (data_url("image/png", ""), "the data URL is not base64"),
        (ImagePart(url="ftp://example.com/cat.png"), r"a base64 data URL or an http\(s\) URL"),
    ],
)
@pytest.mark.parametrize("mode", MODES)
async def test_an_image_anthropic_cannot_take_is_refused_before_sending(
    fake: FakeAnthropicServer, worker: AnthropicWorker, mode: Mode, image: ImagePart, says: str
) -> None:
    # Given a user message whose second image the API would refuse
    shown = (data_url("image/png"), image)
    transcript = [QUESTION[0], ChatMessage(role="user", content="What is this?", images=shown)]

    # When the worker is called with it, whole, streamed or with tools
    with pytest.raises(ProviderRejected, match=says) as caught:
        await call_in(mode, worker, transcript)

    # Then nothing is sent, the error names the worker and the image, and the gateway does not
    # send the same request again
    assert fake.message_requests == []
    assert type(caught.value) is ProviderRejected
    assert str(caught.value).startswith("worker 'claude': messages[1].images[1]: ")
    assert not RetryPolicy().should_retry(caught.value, 1)


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


# -- structured outputs ----------------------------------------------------------------------

# A schema as clients write it (Pydantic's, say): objects not closed, bounds the API refuses.
FORECAST: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "days": {
            "type": "array",
            "minItems": 1,
            "maxItems": 7,
            "items": {
                "type": "object",
                "properties": {"high": {"type": "number", "maximum": 60}},
                "required": ["high"],
            },
        },
        "sky": {"oneOf": [{"type": "string", "enum": ["clear", "cloudy"]}, {"type": "null"}]},
    },
    "required": ["city", "days"],
}
# What reaches Anthropic: every object closed, the bounds left out, oneOf as anyOf.
FORECAST_SENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"high": {"type": "number"}},
                "required": ["high"],
                "additionalProperties": False,
            },
        },
        "sky": {"anyOf": [{"type": "string", "enum": ["clear", "cloudy"]}, {"type": "null"}]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
IN_SCHEMA = AnswerFormat(type="json_schema", name="forecast", json_schema=FORECAST)
AN_OBJECT = AnswerFormat(type="json_object")


def told(answer_format: AnswerFormat) -> list[ChatMessage]:
    """QUESTION with the answer format's instruction, as the caller writes it into the prompt."""
    return [*QUESTION, ChatMessage(role="system", content=answer_format.instruction())]


async def call_in_format(
    worker: AnthropicWorker,
    answer_format: AnswerFormat = IN_SCHEMA,
    messages: list[ChatMessage] | None = None,
) -> Completion:
    return await worker.complete_in_format(
        told(answer_format) if messages is None else messages,
        answer_format,
        max_tokens=64,
        temperature=0.5,
    )


async def test_a_schema_goes_as_output_config_format_closed_and_without_unenforced_bounds(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given a schema the API would refuse as it is (objects open, bounds it cannot enforce)

    # When the worker is asked for an answer in it
    result = await call_in_format(worker)

    # Then it goes as output_config.format (GA: no beta header, not the beta's output_format),
    # made into one the API takes, and the fake (which refuses what the API refuses) answers
    # with JSON that follows the client's own schema
    assert isinstance(worker, FormattedAnswerWorker)
    sent = fake.last_request
    assert sent.json["output_config"] == {
        "format": {"type": "json_schema", "schema": FORECAST_SENT}
    }
    assert "output_format" not in sent.json
    assert "anthropic-beta" not in sent.headers
    assert "stream" not in sent.json
    assert json.loads(IN_SCHEMA.conform(result.text)) == json.loads(result.text)


async def test_the_clients_schema_is_left_as_it_was(worker: AnthropicWorker) -> None:
    before = json.dumps(FORECAST, sort_keys=True)

    await call_in_format(worker)

    assert json.dumps(FORECAST, sort_keys=True) == before


async def test_a_json_object_is_asked_in_the_prompt_only(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given an answer that must be any JSON object: Anthropic has no JSON mode, and a schema of
    # {"type": "object"} is refused (objects must set additionalProperties false, which would
    # leave only {})

    # When the worker is asked for one
    await call_in_format(worker, AN_OBJECT)

    # Then the request is the plain one: the prompt's instruction asks for the object
    assert "output_config" not in fake.last_request.json
    await worker.complete(told(AN_OBJECT), max_tokens=64, temperature=0.5)
    assert fake.requests[-2].json == fake.last_request.json


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"type": "object"}, id="any-object"),
        pytest.param(
            {
                "type": "object",
                "properties": {
                    "tags": {"type": "object", "additionalProperties": {"type": "string"}}
                },
            },
            id="a-map-inside",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
            id="requires-an-unlisted-key",
        ),
        pytest.param(
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "patternProperties": {"^x-": {"type": "string"}},
            },
            id="pattern-properties",
        ),
        pytest.param(
            {
                "type": "object",
                "properties": {"root": {"$ref": "#/$defs/node"}},
                "$defs": {
                    "node": {
                        "type": "object",
                        "properties": {
                            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
                        },
                    }
                },
            },
            id="recursive",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
            id="external-ref",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {"not": {"type": "null"}}}},
            id="not",
        ),
    ],
)
async def test_a_schema_with_no_strict_form_is_asked_in_the_prompt_only(
    fake: FakeAnthropicServer, worker: AnthropicWorker, schema: dict[str, Any]
) -> None:
    # Given a schema that closing every object would change (or that the API refuses whole)
    answer_format = AnswerFormat(type="json_schema", json_schema=schema)

    # When the worker is asked for an answer in it
    result = await call_in_format(worker, answer_format)

    # Then nothing goes natively (the call is not failed by a 400 it could not avoid)
    assert "output_config" not in fake.last_request.json
    assert result.text.startswith("echo: ")


async def test_objects_that_allow_more_keys_are_closed_and_shared_definitions_are_followed(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given objects with listed properties that allow others, and a $ref that is not recursive
    schema = {
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/place"}, "work": {"$ref": "#/$defs/place"}},
        "additionalProperties": True,
        "$defs": {
            "place": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "additionalProperties": {"type": "string"},
            }
        },
    }

    # When the worker is asked for an answer in it
    result = await call_in_format(worker, AnswerFormat(type="json_schema", json_schema=schema))

    # Then they go closed (the answers that fit still follow the client's schema)
    sent = fake.last_request.json["output_config"]["format"]["schema"]
    assert sent["additionalProperties"] is False
    assert sent["$defs"]["place"]["additionalProperties"] is False
    assert sent["properties"] == schema["properties"]
    assert json.loads(result.text) == {"home": {"city": "x"}, "work": {"city": "x"}}


@pytest.mark.parametrize(
    ("model", "native"),
    [
        ("claude-haiku-4-5", True),
        ("claude-sonnet-4-5-20250929", True),
        ("claude-opus-4-6", True),
        ("claude-3-5-haiku-20241022", False),
        ("claude-3-7-sonnet-latest", False),
        ("claude-sonnet-4-20250514", False),
        ("claude-opus-4-1", False),
    ],
)
async def test_models_older_than_structured_outputs_are_asked_in_the_prompt_only(
    fake: FakeAnthropicServer, model: str, native: bool
) -> None:
    adapter = AnthropicWorker.from_spec(spec(fake.base_url, model=model), environ={KEY_ENV: KEY})
    try:
        await call_in_format(adapter)
    finally:
        await adapter.aclose()

    assert ("output_config" in fake.last_request.json) is native


async def test_a_prefilled_answer_is_asked_in_the_prompt_only(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given a conversation that ends with the start of the assistant's answer (a prefill, which
    # the API refuses together with JSON outputs)
    messages = [*told(IN_SCHEMA), ChatMessage(role="assistant", content='{"city":')]

    # When the worker is asked for an answer in the schema
    await call_in_format(worker, messages=messages)

    # Then no output_config goes, and the fake (which refuses the pair) answers
    sent = fake.last_request.json
    assert "output_config" not in sent
    assert sent["messages"][-1] == {"role": "assistant", "content": '{"city":'}


async def test_a_model_that_ignores_the_prompts_instruction_answers_json_when_asked_natively(
    fake: FakeAnthropicServer, worker: AnthropicWorker
) -> None:
    # Given a model that answers in prose whatever the prompt says, unless the request asks for
    # JSON natively
    fake.prose_unless_asked_natively = True
    messages = told(IN_SCHEMA)

    # When it is called plainly, then in the schema
    plain = await call(worker, messages)
    formatted = await call_in_format(worker, messages=messages)

    # Then the plain answer cannot be made JSON, and the one asked natively follows the schema
    with pytest.raises(AnswerFormatError):
        IN_SCHEMA.conform(plain.text)
    answer = json.loads(IN_SCHEMA.conform(formatted.text))
    assert set(answer) == {"city", "days", "sky"}


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
USE = tool_use_block("t1", "get_time", {})
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "noon"}
TOOL_TURNS = [
    {"role": "user", "content": "Time?"},
    {"role": "assistant", "content": [USE]},
    {"role": "user", "content": [RESULT]},
]
TOOL_BODY: dict[str, Any] = {
    **GOOD_BODY,
    "messages": TOOL_TURNS,
    "tools": [{"name": "get_time", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
}


def _without(field: str) -> dict[str, Any]:
    return {k: v for k, v in TOOL_BODY.items() if k not in (field, "tool_choice")}


def _with_turn(number: int, content: list[dict[str, Any]]) -> dict[str, Any]:
    turns = [*TOOL_TURNS]
    turns[number] = {**turns[number], "content": content}
    return {**TOOL_BODY, "messages": turns}


def _with_tool(**fields: Any) -> dict[str, Any]:
    return {**TOOL_BODY, "tools": [TOOL_BODY["tools"][0] | fields]}


def _with_choice(**choice: Any) -> dict[str, Any]:
    return {**TOOL_BODY, "tool_choice": choice}


CLOSED: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "string"}},
    "additionalProperties": False,
}


def _formatted(schema: dict[str, Any]) -> dict[str, Any]:
    return {**GOOD_BODY, "output_config": {"format": {"type": "json_schema", "schema": schema}}}


IMAGE: dict[str, Any] = png_block()
ASK: dict[str, Any] = {"type": "text", "text": "What is this?"}


def _showing(**source: Any) -> dict[str, Any]:
    """A one-turn body showing an image whose source is IMAGE's with ``source`` over it."""
    image = {"type": "image", "source": IMAGE["source"] | source}
    return {**GOOD_BODY, "messages": [{"role": "user", "content": [image, ASK]}]}


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
        (GOOD_HEADERS, TOOL_BODY, 200, "message"),
        (GOOD_HEADERS, _without("tools"), 400, "invalid_request_error"),  # blocks need tools
        (  # a call left unanswered
            GOOD_HEADERS,
            _with_turn(2, [{"type": "text", "text": "x"}]),
            400,
            "invalid_request_error",
        ),
        (  # text before the results
            GOOD_HEADERS,
            _with_turn(2, [{"type": "text", "text": "x"}, RESULT]),
            400,
            "invalid_request_error",
        ),
        (  # a result of no call
            GOOD_HEADERS,
            _with_turn(2, [{**RESULT, "tool_use_id": "t9"}]),
            400,
            "invalid_request_error",
        ),
        (  # a blank text block
            GOOD_HEADERS,
            _with_turn(1, [{"type": "text", "text": " "}, USE]),
            400,
            "invalid_request_error",
        ),
        (GOOD_HEADERS, _with_tool(strict=True), 400, "invalid_request_error"),
        (GOOD_HEADERS, _with_tool(input_schema=None), 400, "invalid_request_error"),
        (  # "none" takes no other field
            GOOD_HEADERS,
            _with_choice(type="none", disable_parallel_tool_use=True),
            400,
            "invalid_request_error",
        ),
        (GOOD_HEADERS, _with_choice(type="tool", name="nope"), 400, "invalid_request_error"),
        (GOOD_HEADERS, _showing(), 200, "message"),
        (
            GOOD_HEADERS,
            {**GOOD_BODY, "messages": [{"role": "user", "content": [url_block(), ASK]}]},
            200,
            "message",
        ),
        (GOOD_HEADERS, _with_turn(2, [RESULT, IMAGE, ASK]), 200, "message"),
        (GOOD_HEADERS, _showing(type="image_url"), 400, "invalid_request_error"),
        (GOOD_HEADERS, _showing(media_type="image/bmp"), 400, "invalid_request_error"),
        (GOOD_HEADERS, _showing(data="not base64!"), 400, "invalid_request_error"),
        (GOOD_HEADERS, _showing(detail="high"), 400, "invalid_request_error"),
        (  # an image before the results
            GOOD_HEADERS,
            _with_turn(2, [IMAGE, RESULT, ASK]),
            400,
            "invalid_request_error",
        ),
        (GOOD_HEADERS, _formatted(CLOSED), 200, "message"),
        (GOOD_HEADERS, _formatted({"type": "object"}), 400, "invalid_request_error"),
        (  # an object inside left open
            GOOD_HEADERS,
            _formatted(CLOSED | {"properties": {"a": {"type": "object", "properties": {}}}}),
            400,
            "invalid_request_error",
        ),
        (  # a bound the API cannot enforce
            GOOD_HEADERS,
            _formatted(CLOSED | {"properties": {"a": {"type": "string", "maxLength": 9}}}),
            400,
            "invalid_request_error",
        ),
        (  # a prefilled answer
            GOOD_HEADERS,
            {
                **_formatted(CLOSED),
                "messages": [*GOOD_BODY["messages"], {"role": "assistant", "content": "{"}],
            },
            400,
            "invalid_request_error",
        ),
        (  # the format's type is json_schema
            GOOD_HEADERS,
            {**GOOD_BODY, "output_config": {"format": {"type": "json_object"}}},
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
