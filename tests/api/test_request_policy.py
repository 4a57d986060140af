"""One request policy at every HTTP door: a field the API does not know is a 400 naming it,
wherever it is sent; a field it knows but cannot honour is a 400 unless it carries the value
that asks for nothing; the fields clients send that do not change the answer are accepted
(docs/serving.md lists them). And the Responses API's smaller doors: the input token count,
``text.format`` echoed as asked, Codex's requests, and the OpenAI endpoints Conductor has not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from fakes.api_fixture import JSON_ANSWER, QUESTION, Api
from fakes.codex_request import ASK, NAMESPACE, codex_request, next_turn


@pytest.fixture
def client(api: Api) -> Iterator[openai.OpenAI]:
    with api.client() as opened:
        yield opened


def _post(api: Api, path: str, body: dict[str, Any]) -> httpx.Response:
    with api.http() as http:
        return http.post(path, json=body)


def _refused(response: httpx.Response, param: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert param in error["message"], error
    return error


# -- chat completions ---------------------------------------------------------------------------

CHAT_REFUSED = [
    ({"frobnicate": 1}, "frobnicate"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"prediction": {"type": "content", "content": "draft"}}, "prediction"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"verbosity": "high"}, "verbosity"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ({"stream_options": {"include_usage": True, "frobnicate": 1}}, "stream_options.frobnicate"),
]


@pytest.mark.parametrize(("fields", "param"), CHAT_REFUSED, ids=[p for _, p in CHAT_REFUSED])
@pytest.mark.parametrize("model", ["conductor-ultra", "alpha"])
def test_chat_refuses_what_it_does_not_know_or_cannot_honour_naming_it(
    api: Api, model: str, fields: dict[str, Any], param: str
) -> None:
    response = _post(api, "/v1/chat/completions", {"model": model, "messages": QUESTION, **fields})

    error = _refused(response, param)
    known = param not in ("frobnicate", "stream_options.frobnicate")
    assert error["code"] == ("unsupported_parameter" if known else "unknown_parameter")


def test_an_unknown_conductor_option_is_named_with_its_path(api: Api) -> None:
    body = {"model": "conductor-ultra", "messages": QUESTION, "conductor": {"pools": ["alpha"]}}

    error = _refused(_post(api, "/v1/chat/completions", body), "conductor.pools")
    assert error["code"] == "unknown_parameter"


def test_chat_names_every_unknown_field_and_the_sdk_raises_bad_request(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="conductor-ultra",
            messages=QUESTION,  # type: ignore[arg-type]
            extra_body={"frobnicate": 1, "zorkmid": 2},
        )

    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "unknown_parameter"
    assert error["param"] == "frobnicate"
    assert "frobnicate" in error["message"]
    assert "zorkmid" in error["message"]


@pytest.mark.parametrize("model", ["conductor-ultra", "alpha"])
def test_chat_accepts_the_fields_that_do_not_change_the_answer(
    client: openai.OpenAI, model: str
) -> None:
    reply = client.chat.completions.create(
        model=model,
        messages=QUESTION,  # type: ignore[arg-type]
        top_p=0.9,
        stop=["\n\n"],
        seed=7,
        frequency_penalty=0.1,
        presence_penalty=0.1,
        user="user-1",
        safety_identifier="user-1",
        prompt_cache_key="session-1",
        store=False,
        reasoning_effort="low",
        logprobs=False,
        top_logprobs=0,
        modalities=["text"],
        service_tier="auto",
        verbosity="medium",
        logit_bias={},
        n=1,
        parallel_tool_calls=True,
        stream_options=None,
    )

    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content


# -- completions and the job API ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
        ({"logit_bias": {"50256": -100}}, "logit_bias", "unsupported_parameter"),
    ],
)
def test_completions_refuse_what_they_do_not_know_or_cannot_honour(
    api: Api, fields: dict[str, Any], param: str, code: str
) -> None:
    response = _post(api, "/v1/completions", {"model": "alpha", "prompt": "Hi", **fields})

    assert _refused(response, param)["code"] == code


def test_completions_accept_the_sampling_fields_of_the_sdk(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model="alpha",
        prompt="Hi",
        top_p=0.9,
        stop=["\n"],
        seed=7,
        frequency_penalty=0.1,
        presence_penalty=0.1,
        user="user-1",
        logit_bias={},
        best_of=1,
        n=1,
    )

    assert reply.choices[0].text == "alpha answers 1 message(s)"


def test_the_job_api_names_an_unknown_field_as_the_others_do(api: Api) -> None:
    response = _post(api, "/v1/workflows", {"question": "What is 6 * 7?", "frobnicate": 1})

    assert _refused(response, "frobnicate")["code"] == "unknown_parameter"


# -- responses ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning": {"effort": "medium", "frobnicate": 1}}, "reasoning.frobnicate"),
        ({"reasoning": {"effort": "maximal"}}, "reasoning.effort"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"client_metadata": {"k": 1}}, "client_metadata.k"),
        ({"stream_options": {"frobnicate": 1}}, "stream_options.frobnicate"),
    ],
)
def test_responses_refuse_reasoning_and_include_values_they_do_not_know(
    api: Api, fields: dict[str, Any], param: str
) -> None:
    body = {"model": "conductor-ultra", "input": "What is 6 * 7?", **fields}

    _refused(_post(api, "/v1/responses", body), param)


def test_responses_accept_the_reasoning_settings_codex_sends_to_openai(api: Api) -> None:
    # Codex adds stream_options when its provider is OpenAI's own (base URL overridden)
    body = {
        "model": "alpha",
        "input": "What is 6 * 7?",
        "stream": True,
        "stream_options": {"reasoning_summary_delivery": "sequential_cutoff"},
        "reasoning": {"effort": "xhigh", "summary": "detailed"},
        "include": ["reasoning.encrypted_content"],
    }

    events = _events(_post(api, "/v1/responses", body))

    completed = events[-1]["response"]
    assert completed["status"] == "completed"
    assert completed["reasoning"] == {"effort": None, "summary": None}  # nothing was applied
    assert [item["type"] for item in completed["output"]] == ["message"]


def test_a_response_echoes_the_json_schema_format_it_was_asked_for(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}, "unit": {"type": "string"}},
        "required": ["answer", "unit"],
        "additionalProperties": False,
    }
    form = {"type": "json_schema", "name": "result", "schema": schema, "strict": True}

    response = client.responses.create(
        model="jsoner",
        input="What is 6 * 7?",
        text={"format": form},  # type: ignore[typeddict-item]
    )

    assert json.loads(response.output_text) == JSON_ANSWER
    echoed = response.text.format  # type: ignore[union-attr]
    assert echoed.type == "json_schema"
    assert echoed.name == "result"  # type: ignore[union-attr]
    assert echoed.schema_ == schema  # type: ignore[union-attr]
    assert echoed.strict is True  # type: ignore[union-attr]
    # read back, it is the same
    assert client.responses.retrieve(response.id).text.format.type == "json_schema"  # type: ignore[union-attr]


@pytest.mark.parametrize("model", ["conductor-ultra", "alpha"])
def test_the_input_token_count_counts_what_a_response_would_be_sent(
    client: openai.OpenAI, model: str
) -> None:
    short = client.responses.input_tokens.count(model=model, input="What is 6 * 7?")
    longer = client.responses.input_tokens.count(
        model=model,
        input=[{"role": "user", "content": "What is 6 * 7? " * 40}],
        instructions="Answer with the number only.",
    )

    assert short.object == "response.input_tokens"
    assert 0 < short.input_tokens < longer.input_tokens


def test_the_input_token_count_refuses_as_create_does(api: Api, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model="gpt-nope", input="Hi")
    refused = _post(
        api, "/v1/responses/input_tokens", {"model": "alpha", "input": "Hi", "frobnicate": 1}
    )
    assert _refused(refused, "frobnicate")["code"] == "unknown_parameter"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/conversations"),
        ("GET", "/v1/conversations/conv_1"),
        ("POST", "/v1/conversations/conv_1/items"),
    ],
)
def test_endpoints_conductor_has_not_say_so(api: Api, method: str, path: str) -> None:
    with api.http() as http:
        response = http.request(method, path, json={"model": "alpha", "input": "Hi"})

    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_endpoint"
    assert "not supported by Conductor" in error["message"]


def test_the_sdk_reads_embeddings_as_not_found_with_the_reason(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="not supported by Conductor"):
        client.embeddings.create(model="alpha", input="Hi")


# -- Codex CLI ----------------------------------------------------------------------------------


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    lines = response.text.splitlines()
    return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]


def test_codex_with_its_default_web_search_is_told_how_to_turn_it_off(api: Api) -> None:
    for model in ("alpha", "conductor-ultra"):
        response = _post(api, "/v1/responses", codex_request(model))

        error = _refused(response, "tools[2].type")
        assert 'web_search = "disabled"' in error["message"]


def test_a_namespaces_functions_are_offered_flat_and_its_call_comes_back_named_by_it(
    api: Api,
) -> None:
    # Given Codex's turn with a namespace of functions first among its tools
    body = codex_request("alpha", web_search=False)
    body["tools"].insert(0, NAMESPACE)

    # When alpha calls the first function it is offered
    completed = _events(_post(api, "/v1/responses", body))[-1]

    # Then it was offered the namespace's function as one plain function, and its call comes
    # back as the client named it: the function's own name, and the namespace beside it
    offered = api.workers["alpha"].tools_offered[-1].tools
    assert offered[0].name == "mcp__docs____search"
    assert offered[0].parameters == NAMESPACE["tools"][0]["parameters"]
    [call] = [i for i in completed["response"]["output"] if i["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("search", "mcp__docs__")

    # When the client sends the call back with its output, the worker reads the pair as one
    second = next_turn(body, call, "3 pages")
    second["input"][-2]["namespace"] = "mcp__docs__"
    completed = _events(_post(api, "/v1/responses", second))[-1]
    assert completed["type"] == "response.completed"
    sent = api.workers["alpha"].calls[-1].messages
    assert sent[-2].tool_calls[0].name == "mcp__docs____search"
    assert sent[-1].content == "3 pages"


def test_codex_runs_a_tool_calling_turn_against_a_worker(api: Api) -> None:
    # Given Codex's first turn, as it sends it with web_search = "disabled"
    first = codex_request("alpha", web_search=False)

    # When it streams alpha's answer
    events = _events(_post(api, "/v1/responses", first))

    # Then alpha asks for the shell, and the stream ends with the call in the response
    completed = events[-1]
    assert completed["type"] == "response.completed", events
    [call] = [item for item in completed["response"]["output"] if item["type"] == "function_call"]
    assert call["name"] == "shell"
    assert "command" in json.loads(call["arguments"])
    # what Codex sends alongside is accepted and kept: its client metadata as metadata
    metadata = completed["response"]["metadata"]
    assert metadata["x-codex-window-id"] == "1"
    assert metadata["session_id"] == first["client_metadata"]["session_id"]
    # the tools reached alpha as functions, without the reasoning items Codex asked to include
    offered = api.workers["alpha"].tools_offered[-1]
    assert [t.name for t in offered.tools] == ["shell", "update_plan"]
    assert not [i for i in completed["response"]["output"] if i["type"] == "reasoning"]

    # When Codex runs the command and sends the whole conversation again with its output
    second = next_turn(first, call, "README.md\nsrc\n")
    events = _events(_post(api, "/v1/responses", second))

    # Then alpha answers with the output, and saw the conversation in order
    completed = events[-1]
    assert completed["type"] == "response.completed", events
    text = [part["text"] for item in completed["response"]["output"] for part in item["content"]]
    assert text == ["alpha read the tool's result: README.md\nsrc\n"]
    sent = api.workers["alpha"].calls[-1].messages
    assert [m.role for m in sent] == ["system", "system", "user", "user", "assistant", "tool"]
    assert sent[3].content == ASK


def test_codex_runs_a_tool_calling_turn_on_a_variant(api: Api) -> None:
    # Given Codex's first turn to a variant, as it sends it with web_search = "disabled"
    first = codex_request("conductor-ultra", web_search=False)

    # When it streams the workflow's answer
    events = _events(_post(api, "/v1/responses", first))

    # Then the answering step (beta) asks for the shell, and the stream ends with the call
    completed = events[-1]
    assert completed["type"] == "response.completed", events
    [call] = [item for item in completed["response"]["output"] if item["type"] == "function_call"]
    assert call["name"] == "shell"
    assert [t.name for t in api.workers["beta"].tools_offered[-1].tools] == ["shell", "update_plan"]
    # and its client metadata is the workflow's labels
    workflow_id = completed["response"]["conductor"]["workflow_id"]
    with api.http() as http:
        labels = http.get(f"/v1/workflows/{workflow_id}").json()["metadata"]
    assert labels["thread_id"] == first["client_metadata"]["thread_id"]
    # a value over a label's 512 characters would be cut to them; this one fits
    assert labels["x-codex-turn-metadata"] == first["client_metadata"]["x-codex-turn-metadata"]

    # the workflow's progress comes first, as a reasoning item without encrypted content
    [reasoning] = [item for item in completed["response"]["output"] if item["type"] == "reasoning"]
    assert completed["response"]["output"][0] == reasoning
    assert reasoning["encrypted_content"] is None

    # When Codex runs the command and sends the whole conversation again with its output, and
    # the reasoning item before the call, as it keeps every item of its history
    second = next_turn(first, call, "README.md\nsrc\n")
    second["input"].insert(-2, reasoning)
    events = _events(_post(api, "/v1/responses", second))

    # Then a new workflow answers with the output it saw in the conversation
    completed = events[-1]
    assert completed["type"] == "response.completed", events
    output = completed["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert [part["text"] for part in output[1]["content"]] == [
        "beta read the tool's result: README.md"
    ]
