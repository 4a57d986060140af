"""Tools on workflows, with the clients agents run on: a variant takes the client's functions,
its answering step (beta, the scripted Conductor's checker) alone is offered them, its calls
come back as the client's SDK reads them, and the client's next request, with the results, is a
new workflow that sees the whole conversation. Forced calls are how instructor, pydantic-ai,
LangChain and the Agents SDK ask for structured output by default."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from fakes.api_fixture import Api

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
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Forecast(BaseModel):
    city: str
    degrees: int


def _workflow(http: httpx.Client, workflow_id: str) -> dict[str, Any]:
    view = http.get(f"/v1/workflows/{workflow_id}")
    assert view.status_code == 200, view.text
    return dict(view.json())


def _offered(api: Api) -> dict[str, int]:
    return {name: len(worker.tools_offered) for name, worker in api.workers.items()}


def test_a_variant_offered_a_tool_returns_its_answering_steps_call_and_answers_with_its_result(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    before = _offered(api)

    # When the client offers a tool to conductor-ultra
    first = client.chat.completions.create(model="conductor-ultra", messages=ASK, tools=[WEATHER])  # type: ignore[list-item,arg-type]

    # Then the answering step (beta) asked for the call, as the SDK reads it; alpha, which
    # solved first, was never offered the tools
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    after = _offered(api)
    assert after["beta"] == before["beta"] + 1
    assert after["alpha"] == before["alpha"]

    # And the trace keeps the call, on the step and as the workflow's answer
    workflow_id = first.model_extra["conductor"]["workflow_id"]  # type: ignore[index]
    with api.http() as http:
        trace = _workflow(http, workflow_id)
    assert trace["tool_calls"] == [
        call.model_dump(include={"id"})
        | {"name": "get_weather", "arguments": call.function.arguments}
    ]  # type: ignore[union-attr]
    assert trace["steps"][-1]["tool_calls"] == trace["tool_calls"]
    assert trace["steps"][0]["tool_calls"] == []

    # When the client sends the call's result back
    second = client.chat.completions.create(
        model="conductor-ultra",
        messages=[
            *ASK,
            choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
    )

    # Then a new workflow plans with the conversation in view and answers with the result
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "beta read the tool's result: 18 C and sunny"
    assert second.model_extra["conductor"]["workflow_id"] != workflow_id  # type: ignore[index]


def test_a_streamed_variant_call_arrives_as_the_sdk_assembles_it(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    stream = client.chat.completions.create(
        model="conductor-ultra",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        stream=True,
    )
    chunks = list(stream)

    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls"
    [delta] = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert delta.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(delta.function.arguments or "") == {"city": "Paris"}  # type: ignore[union-attr]


def test_responses_on_a_variant_pass_a_function_call_out_and_take_its_output_back(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    tool = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
    first = client.responses.create(
        model="conductor-ultra",
        input="What is the weather in Paris?",
        tools=[tool],  # type: ignore[list-item]
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather"

    second = client.responses.create(
        model="conductor-ultra",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[tool],  # type: ignore[list-item]
    )
    assert second.output_text == "beta read the tool's result: 18 C"


def test_a_variant_whose_pool_has_no_worker_that_takes_tools_is_a_400_naming_tools(
    api: Api,
) -> None:
    with api.http() as http:
        reply = http.post(
            "/v1/chat/completions",
            json={
                "model": "conductor-ultra",
                "messages": ASK,
                "tools": [WEATHER],
                "conductor": {"pool": ["gamma"]},  # llama.cpp: no tools
            },
        )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "tools"
    assert "no worker of this workflow's pool (gamma) takes tools" in error["message"]


def test_conductor_mini_routes_a_request_with_tools_to_a_worker_that_takes_them(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    reply = client.chat.completions.create(
        model="conductor-mini",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        extra_body={"conductor": {"pool": ["gamma", "alpha"]}},
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    [step] = reply.model_extra["conductor"]["steps"]  # type: ignore[index]
    assert step["worker"] == "alpha"


def _langchain(api: Api, model: str = "conductor-ultra") -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=f"{api.url}/v1", api_key=api.key, max_retries=0)  # type: ignore[arg-type]


def test_langchain_bind_tools_runs_a_tool_loop_on_a_variant(api: Api) -> None:
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        return f"18 C in {city}"

    model = _langchain(api).bind_tools([get_weather])
    ask = HumanMessage("What is the weather in Paris?")
    asked = model.invoke([ask])
    [call] = asked.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "get_weather"
    assert call["args"] == {"city": "Paris"}

    result = get_weather.invoke(call["args"])
    answered = model.invoke([ask, asked, ToolMessage(result, tool_call_id=call["id"])])
    assert answered.content == "beta read the tool's result: 18 C in Paris"


def test_langchain_function_calling_structured_output_on_a_variant(api: Api) -> None:
    structured = _langchain(api).with_structured_output(Forecast, method="function_calling")
    assert structured.invoke("The forecast for Paris?") == Forecast(city="Paris", degrees=7)


def test_instructor_default_mode_on_a_variant(api: Api, request: pytest.FixtureRequest) -> None:
    import instructor

    sdk = api.client()
    request.addfinalizer(sdk.close)
    client = instructor.from_openai(sdk)
    forecast = client.chat.completions.create(
        model="conductor-ultra",
        response_model=Forecast,
        messages=[{"role": "user", "content": "The forecast for Paris?"}],
        max_retries=0,
    )
    assert forecast.model_dump() == {"city": "Paris", "degrees": 7}


def test_pydantic_ai_default_output_type_on_a_variant(api: Api) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=api.key, max_retries=0)
        async with client:
            provider = OpenAIProvider(openai_client=client)
            model = OpenAIChatModel("conductor-ultra", provider=provider)
            return await Agent(model, output_type=Forecast).run("The forecast for Paris?")

    assert asyncio.run(run()).output == Forecast(city="Paris", degrees=7)


def _agents_model(client: openai.AsyncOpenAI) -> Any:
    from agents import OpenAIResponsesModel, set_tracing_disabled

    set_tracing_disabled(True)
    return OpenAIResponsesModel(model="conductor-ultra", openai_client=client)


def test_the_agents_sdk_runs_a_function_tool_on_a_variant(api: Api) -> None:
    from agents import Agent, Runner, function_tool

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
                model=_agents_model(client),
                tools=[get_weather],
            )
            return await Runner.run(agent, "What is the weather in Paris?")

    result = asyncio.run(run())
    assert asked == ["Paris"]
    assert result.final_output == "beta read the tool's result: 18 C and sunny in Paris"


class Result(BaseModel):
    answer: int
    unit: str | None


def test_the_agents_sdk_output_type_on_a_variant(api: Api) -> None:
    """Its output_type is a JSON Schema in ``text.format``: jsoner writes JSON when told."""
    from agents import Agent, ModelSettings, Runner

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=api.key)
        async with client:
            agent = Agent(
                name="Solver",
                model=_agents_model(client),
                output_type=Result,
                model_settings=ModelSettings(extra_body={"conductor": {"pool": ["jsoner"]}}),
            )
            return await Runner.run(agent, "What is 6 * 7?")

    result = asyncio.run(run())
    assert result.final_output == Result(answer=42, unit="none")
