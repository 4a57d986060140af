"""Function calling with the clients people use: the openai SDK (whole and streamed) and
LangChain's ``bind_tools`` on a worker called directly, which passes the tools to the worker
and its calls back to the client; and what a workflow does with tools and tool turns."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from fakes.api_fixture import QUESTION, Api

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_a_worker_called_with_tools_asks_for_a_call_and_answers_with_its_result(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    # When the client offers a tool to alpha
    first = client.chat.completions.create(model="alpha", messages=ask, tools=[WEATHER])  # type: ignore[list-item,arg-type]

    # Then alpha asks for the call, as the SDK reads it
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    offered = api.workers["alpha"].tools_offered[-1]
    assert [t.name for t in offered.tools] == ["get_weather"]
    assert offered.tools[0].parameters == WEATHER["function"]["parameters"]  # type: ignore[index]

    # When the client sends the call's result back
    second = client.chat.completions.create(
        model="alpha",
        messages=[
            *ask,
            choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
    )

    # Then alpha answers with it, and saw the call and its result in order
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "alpha read the tool's result: 18 C and sunny"
    sent = api.workers["alpha"].calls[-1].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    assert sent[1].tool_calls[0].id == call.id
    assert sent[2].tool_call_id == call.id


def test_a_streamed_tool_call_arrives_as_the_sdk_assembles_it(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    stream = client.chat.completions.create(
        model="alpha",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += delta.function.name or "" if delta.function else ""
                entry["arguments"] += delta.function.arguments or "" if delta.function else ""

    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert api.workers["alpha"].tools_offered[-1].choice == "get_weather"


def test_langchain_bind_tools_runs_a_tool_loop_through_a_worker(api: Api) -> None:
    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    model = ChatOpenAI(
        model="alpha",
        base_url=f"{api.url}/v1",
        api_key=api.key,  # type: ignore[arg-type]
        max_retries=0,
    ).bind_tools([multiply])
    question = HumanMessage("What is 7 times 7?")

    # When LangChain asks with the tool bound
    asked = model.invoke([question])

    # Then the model's call comes back as LangChain's tool call, with typed arguments
    assert isinstance(asked, AIMessage)
    [call] = asked.tool_calls
    assert (call["name"], call["args"]) == ("multiply", {"a": 7, "b": 7})

    # When the tool runs and its result goes back
    result = multiply.invoke(call["args"])
    answered = model.invoke([question, asked, ToolMessage(str(result), tool_call_id=call["id"])])

    # Then the worker answers with the result
    assert answered.content == "alpha read the tool's result: 49"


def test_a_workflow_reads_tool_turns_as_conversation_and_takes_tools_it_may_not_call(
    api: Api,
) -> None:
    # Given a conversation in which a function was called and answered
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
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
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
        {"role": "user", "content": "Should I take an umbrella?"},
    ]

    # When a workflow is asked, with tools it is told not to call
    with api.http() as http:
        reply = http.post(
            "/v1/chat/completions",
            json={
                "model": "conductor-ultra",
                "messages": messages,
                "tools": [WEATHER],
                "tool_choice": "none",
            },
        )
        assert reply.status_code == 200, reply.text
        workflow = _workflow(http, reply.json())

    # Then the Conductor's question holds the call and its result as conversation
    assert '[called get_weather({"city": "Paris"})]' in workflow["question"]
    assert "Tool result (call_1): 18 C and sunny" in workflow["question"]
    assert workflow["question"].endswith("Request:\nShould I take an umbrella?")


def _workflow(http: httpx.Client, completion: dict[str, Any]) -> dict[str, Any]:
    workflow_id = completion["conductor"]["workflow_id"]
    view = http.get(f"/v1/workflows/{workflow_id}")
    assert view.status_code == 200, view.text
    return dict(view.json())


def test_a_tool_call_failure_is_one_attempt_without_retries(
    api: Api, request: pytest.FixtureRequest
) -> None:
    # When delta (always down) is offered tools by a key that may use only delta, through a
    # client that retries what it is told it may
    client = openai.OpenAI(base_url=f"{api.url}/v1", api_key=api.delta_key, max_retries=2)
    request.addfinalizer(client.close)
    calls_before = len(api.workers["delta"].calls)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="delta", messages=QUESTION, tools=[WEATHER])  # type: ignore[arg-type,list-item]

    # Then it fails once, told not to retry, without naming the internal address
    assert failed.value.status_code == 502
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert "10.20.30.40" not in failed.value.response.text
    assert len(api.workers["delta"].calls) == calls_before + 1


# -- the Responses API, and the Agents SDK's function tools on it ---------------------------

WEATHER_TOOL = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]


def test_responses_pass_a_function_call_out_and_its_output_back(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)

    # When alpha is offered a function through the Responses API
    first = client.responses.create(
        model="alpha",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )

    # Then the response's output is the call, as the SDK types it, and the tools are echoed
    [call] = first.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert [tool.name for tool in first.tools] == ["get_weather"]  # type: ignore[union-attr]
    assert client.responses.retrieve(first.id).output[0].type == "function_call"

    # When the output goes back, continuing the stored response
    second = client.responses.create(
        model="alpha",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )

    # Then alpha answers with it, having seen its call and the output in order
    assert second.output_text == "alpha read the tool's result: 18 C"
    sent = api.workers["alpha"].calls[-1].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    assert sent[1].tool_calls[0].id == sent[2].tool_call_id == call.call_id
    items = client.responses.input_items.list(second.id).data
    assert [item.type for item in items] == ["function_call_output"]


def test_a_streamed_function_call_validates_against_the_sdk_types(
    api: Api, request: pytest.FixtureRequest
) -> None:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    client = api.client()
    request.addfinalizer(client.close)
    stream = client.responses.create(
        model="alpha",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        stream=True,
    )
    events = [TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump()) for e in stream]

    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-2]
    assert done.item.type == "function_call"  # type: ignore[union-attr]
    assert json.loads(done.item.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert events[-1].response.output[0].id == done.item.id  # type: ignore[union-attr]


def test_the_agents_sdk_runs_a_function_tool_through_a_worker(api: Api) -> None:
    # Imported here: two seconds that the other tests (and collection) need not wait for.
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        asked.append(city)
        return f"18 C and sunny in {city}"

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=api.key)
        async with client:
            agent = Agent(
                name="Forecaster",
                instructions="Use the tool.",
                model=OpenAIResponsesModel(model="alpha", openai_client=client),
                tools=[get_weather],
            )
            return await Runner.run(agent, "What is the weather in Paris?")

    result = asyncio.run(run())

    # Then the SDK ran the function the worker asked for and the worker answered with its result
    assert asked == ["Paris"]
    assert result.final_output == "alpha read the tool's result: 18 C and sunny in Paris"
    offered = api.workers["alpha"].tools_offered[-1]
    assert [tool.name for tool in offered.tools] == ["get_weather"]


# -- a direct call's own max_tokens and temperature -------------------------------------------


def test_a_direct_call_takes_its_max_tokens_within_the_pool_files_and_its_temperature(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    alpha = api.workers["alpha"]

    # When alpha is asked with a bound below its answer, then one above the pool file's
    cut = client.chat.completions.create(
        model="alpha",
        messages=QUESTION,  # type: ignore[arg-type]
        max_completion_tokens=2,
        temperature=0.9,
    )
    cut_call = alpha.calls[-1]
    whole = client.chat.completions.create(model="alpha", messages=QUESTION, max_tokens=5000)  # type: ignore[arg-type]
    whole_call = alpha.calls[-1]
    response = client.responses.create(model="alpha", input="Hi", max_output_tokens=3)
    text = client.completions.create(model="alpha", prompt="Hi", max_tokens=1, temperature=0)

    # Then the worker got each bound (the pool file's 1024 at most) and temperature, and a cut
    # answer says so
    assert (cut_call.max_tokens, cut_call.temperature) == (2, 0.9)
    assert cut.choices[0].message.content == "alpha answers"
    assert cut.choices[0].finish_reason == "length"
    assert (whole_call.max_tokens, whole_call.temperature) == (1024, 0.2)
    assert whole.choices[0].finish_reason == "stop"
    assert response.output_text == "alpha answers 1"
    assert text.choices[0].finish_reason == "length"
    assert (alpha.calls[-1].max_tokens, alpha.calls[-1].temperature) == (1, 0.0)


def test_a_response_cut_at_max_output_tokens_is_incomplete_whole_and_streamed(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)

    whole = client.responses.create(model="alpha", input="Hi", max_output_tokens=2)
    events = list(
        client.responses.create(model="alpha", input="Hi", max_output_tokens=2, stream=True)
    )

    assert whole.status == "incomplete"
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text == "alpha answers"
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "incomplete"  # type: ignore[union-attr]
    assert client.responses.retrieve(whole.id).status == "incomplete"


def test_a_worker_the_key_may_not_call_is_not_found_whatever_it_is_sent(api: Api) -> None:
    # A key limited to alpha asks gamma (llama.cpp, no tools) with tools and with an image: a
    # 400 saying what gamma takes would tell the key about a worker it may not see
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    bodies = [
        {"model": "gamma", "messages": QUESTION, "tools": [WEATHER]},
        {"model": "gamma", "messages": [{"role": "user", "content": [image]}]},
    ]
    with api.http(api.alpha_key) as http:
        replies = [http.post("/v1/chat/completions", json=body) for body in bodies]
        response = http.post(
            "/v1/responses", json={"model": "gamma", "input": "Hi", "tools": [WEATHER_TOOL]}
        )

    assert [r.status_code for r in [*replies, response]] == [404, 404, 404]
    assert all("gamma" not in r.json()["error"]["message"].split("'")[2:] for r in replies)


def test_an_overlong_tool_call_id_is_a_400_naming_it(api: Api) -> None:
    call = {"id": "x" * 201, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "model": "alpha",
        "messages": [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}],
    }
    with api.http() as http:
        reply = http.post("/v1/chat/completions", json=body)

    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "messages[1].tool_calls[0].id"


def test_parallel_function_calls_stream_as_consecutive_output_items(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    clock = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}

    # When alpha must call and calls both tools at once, streamed
    events = list(
        client.responses.create(
            model="alpha",
            input="Weather and time in Paris?",
            tools=[WEATHER_TOOL, clock],  # type: ignore[list-item]
            tool_choice="required",
            stream=True,
        )
    )

    # Then each call is its own output item, at indexes 0 and 1, as the final response has them
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.name) for e in added] == [(0, "get_weather"), (1, "get_time")]  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert [item.name for item in final.output] == ["get_weather", "get_time"]  # type: ignore[union-attr]
