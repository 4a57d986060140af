"""Structured output (``response_format``) and what the API refuses rather than ignores (tools
where they have no meaning, images), with the official openai client and LangChain's
ChatOpenAI."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from fakes.api_fixture import JSON_ANSWER, QUESTION, Api

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "unit": {"type": "string"}},
    "required": ["answer"],
}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "result", "schema": SCHEMA}}
ONLY_JSONER = {"conductor": {"pool": ["jsoner"]}}
NOT_A_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
IMAGE = "data:image/png;base64,AA=="
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _create(api: Api, **fields: Any) -> Any:
    return api.client().chat.completions.create(
        model=fields.pop("model", "conductor-ultra"), messages=QUESTION, **fields
    )


@pytest.mark.parametrize(
    "response_format", [JSON_SCHEMA_FORMAT, {"type": "json_object"}], ids=["schema", "object"]
)
def test_a_workflow_answers_the_json_asked_for(api: Api, response_format: Any) -> None:
    # Given a worker that wraps JSON in prose and a code fence when told to write JSON
    reply = _create(api, response_format=response_format, extra_body=ONLY_JSONER)

    # Then the answer is the bare JSON object, and the answering step was told the form
    assert json.loads(reply.choices[0].message.content) == JSON_ANSWER
    told = api.workers["jsoner"].calls[-1].messages[-1].content
    assert "single JSON object" in told
    if response_format["type"] == "json_schema":
        assert json.dumps(SCHEMA, sort_keys=True) in told


def test_a_worker_called_directly_answers_the_json_asked_for(api: Api) -> None:
    reply = _create(api, model="jsoner", response_format=JSON_SCHEMA_FORMAT)
    assert json.loads(reply.choices[0].message.content) == JSON_ANSWER


def test_an_answer_that_does_not_match_the_schema_fails_without_retries(api: Api) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    strict = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    with pytest.raises(openai.APIStatusError) as failed:
        _create(api, response_format=strict, extra_body=ONLY_JSONER)
    assert failed.value.status_code == 502
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert "does not match the schema" in failed.value.response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": NOT_A_SCHEMA}, "response_format"),
        ({"model": "jsoner", "response_format": NOT_A_SCHEMA}, "response_format"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "conductor": {"pool": ["gamma"]},
            },
            "tools",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"model": "gamma", "tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools",
        ),
        (
            {
                "model": "gamma",
                "messages": [
                    *QUESTION,
                    {"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c1", "content": "42"},
                ],
            },
            "messages[1]",
        ),
        (
            {
                "model": "alpha",
                "messages": [
                    *QUESTION,
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "42"},
                ],
            },
            "messages[1].tool_calls[0]",
        ),
        (
            {
                "model": "alpha",
                "messages": [*QUESTION, {"role": "tool", "content": "42"}],
            },
            "messages[1].tool_call_id",
        ),
        (
            {"model": "alpha", "tools": [{"type": "custom", "custom": {"name": "f"}}]},
            "tools[0].type",
        ),
        (
            {
                "model": "alpha",
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is in the picture?"},
                            {"type": "image_url", "image_url": {"url": IMAGE}},
                        ],
                    }
                ]
            },
            "messages[0].content[1]",
        ),
    ],
    ids=[
        "bad-schema",
        "bad-schema-direct",
        "tools-on-a-workflow-whose-pool-takes-none",
        "tool-choice-without-tools",
        "tools-to-a-worker-without-them",
        "tool-messages-to-a-worker-without-them",
        "a-call-without-its-function",
        "a-result-without-its-call",
        "a-custom-tool",
        "a-choice-of-no-offered-tool",
        "image",
    ],
)
def test_what_the_api_cannot_do_is_a_400_naming_the_field(
    api: Api, fields: dict[str, Any], param: str
) -> None:
    body = {"model": "conductor-ultra", "messages": QUESTION, **fields}
    with httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}, timeout=30
    ) as http:
        reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert param.split("[")[0] in error["message"]


class Result(BaseModel):
    answer: int
    unit: str | None = None


def _langchain(api: Api) -> ChatOpenAI:
    return ChatOpenAI(
        model="conductor-ultra",
        base_url=f"{api.url}/v1",
        api_key=api.key,  # type: ignore[arg-type]
        max_retries=0,
        extra_body=ONLY_JSONER,
    )


def test_langchain_with_structured_output_gets_the_model_it_asked_for(api: Api) -> None:
    structured = _langchain(api).with_structured_output(Result, method="json_schema")
    result = structured.invoke("What is 6 * 7?")
    assert result == Result(answer=42, unit="none")


def test_langchain_json_mode_gets_a_dict(api: Api) -> None:
    structured = _langchain(api).with_structured_output(None, method="json_mode")
    assert structured.invoke("What is 6 * 7? Answer in JSON.") == JSON_ANSWER


# -- asked natively -----------------------------------------------------------------------------

ONLY_NATIVE = {"conductor": {"pool": ["native"]}}
SAYS_WHAT = "Answer as a JSON object with the keys answer and unit."


def test_a_workflow_asks_its_answering_worker_for_json_natively(
    api: Api, request: pytest.FixtureRequest
) -> None:
    # Given a worker that writes JSON only when its provider is asked for it natively
    native = api.workers["native"]
    before = len(native.formats_asked)
    client = api.client()
    request.addfinalizer(client.close)

    # When a one-step workflow on it is asked for a json_object, the object described in
    # the client's system message
    reply = client.chat.completions.create(
        model="conductor-ultra",
        messages=[{"role": "system", "content": SAYS_WHAT}, *QUESTION],  # type: ignore[list-item]
        response_format={"type": "json_object"},
        extra_body=ONLY_NATIVE,
    )

    # Then the answer is its JSON: the worker was asked natively, and told the client's words
    assert json.loads(reply.choices[0].message.content or "") == JSON_ANSWER
    [form] = native.formats_asked[before:]
    assert form.type == "json_object"
    assert form.instructions == SAYS_WHAT
    assert SAYS_WHAT in form.instruction()


def test_a_direct_call_asks_the_worker_for_json_natively(
    api: Api, request: pytest.FixtureRequest
) -> None:
    client = api.client()
    request.addfinalizer(client.close)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    reply = client.chat.completions.create(
        model="native",
        messages=QUESTION,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert json.loads(reply.choices[0].message.content or "") == JSON_ANSWER
    form = api.workers["native"].formats_asked[-1]
    assert form.json_schema == schema
    assert form.instructions is None  # a worker called directly reads the system text itself
