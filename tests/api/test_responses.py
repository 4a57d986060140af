"""The Responses API (``/v1/responses``) and ``/v1/completions``, driven by the real clients:
the ``openai`` package, the OpenAI Agents SDK with its default model class, and LlamaIndex's
``OpenAILike`` with its defaults, against the live server over both runtimes.

The models are scripted (see ``fakes.api_fixture``): the Conductor solves with the first worker
it is shown and has the second check; each worker answers with the number of messages it got,
so what reaches a worker shows in its answer, and what reaches the Conductor shows in the
workflow's question.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import TypeAdapter

from fakes.api_fixture import ANSWER, JSON_ANSWER, Api

QUESTION = "What is 6 * 7?"
QUESTION_ITEMS = [{"role": "user", "content": QUESTION}]
EVENT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
# One part of a reasoning item's summary: a workflow's progress fact.
SUMMARY_PART = [
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done",
]
# A workflow's: its progress as a reasoning item (output 0), then the answer's message.
WORKFLOW_EVENT_ORDER = [
    *EVENT_ORDER[:2],
    "response.output_item.added",
    *SUMMARY_PART,
    "response.output_item.done",
    *EVENT_ORDER[2:],
]
# The Conductor's plan (TwoStepBackend) and the end of the step before the answering one.
PROGRESS = ["Plan (round 1): 1. alpha: Solve it. 2. beta: Check it.", "Step 1 (alpha) done."]


@pytest.fixture
def client(api: Api) -> Iterator[openai.OpenAI]:
    """The official client (no retries), closed after the test."""
    with api.client() as opened:
        yield opened


def _workflow(api: Api, workflow_id: str, key: str | None = None) -> dict[str, Any]:
    with api.http(key) as http:
        response = http.get(f"/v1/workflows/{workflow_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _workflow_id(response: Any) -> str:
    workflow_id: str = response.model_extra["conductor"]["workflow_id"]
    return workflow_id


def _question(api: Api, response: Any) -> str:
    question: str = _workflow(api, _workflow_id(response))["question"]
    return question


def _post(api: Api, path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    with api.http(key) as http:
        return http.post(path, json=body)


def _deduplicated(kinds: list[str]) -> list[str]:
    """The event types in order, each run of deltas as one, and each run of a reasoning
    item's summary parts as one part."""
    parts: list[str] = []
    for kind in kinds:
        if kind == SUMMARY_PART[0] and parts[-len(SUMMARY_PART) :] == SUMMARY_PART:
            del parts[-len(SUMMARY_PART) :]  # the part before it: one stands for the run
        parts.append(kind)
    return [k for i, k in enumerate(parts) if i == 0 or k != parts[i - 1]]


def _items(output: list[Any]) -> list[dict[str, Any]]:
    """Output items as JSON, to compare (a parsed response's text parts have ``parsed``)."""
    return [item.model_dump(exclude_none=True) for item in output]


def _summary(item: Any) -> list[str]:
    """A reasoning item's summary texts (an SDK object or its JSON)."""
    if isinstance(item, dict):
        return [part["text"] for part in item["summary"]]
    return [part.text for part in item.summary]


# -- responses.create ----------------------------------------------------------------------------


def test_a_response_is_a_workflow_with_its_usage_and_steps(api: Api, client: openai.OpenAI) -> None:
    response = client.responses.create(model="conductor-ultra", input=QUESTION)

    assert response.output_text == ANSWER
    assert response.status == "completed"
    assert response.object == "response"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    extra = response.model_extra["conductor"]
    assert response.id == f"resp_{extra['workflow_id'].replace('-', '')}"
    assert [s["worker"] for s in extra["steps"]] == ["alpha", "beta"]
    workflow = _workflow(api, extra["workflow_id"])
    assert workflow["question"] == QUESTION
    assert workflow["answer"] == ANSWER
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens == workflow["usage"]["prompt_tokens"] > 100
    assert usage.output_tokens == workflow["usage"]["completion_tokens"]
    assert usage.total_tokens == workflow["usage"]["total_tokens"]
    assert usage.input_tokens_details.cached_tokens == workflow["usage"]["cached_tokens"]
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_item_input_and_instructions_reach_the_conductor(api: Api, client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="conductor-mini",
        instructions="Answer in French.",
        input=[
            {"role": "user", "content": "Remember 6."},
            {"role": "assistant", "content": [{"type": "output_text", "text": "OK."}]},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Times "},
                    {"type": "input_text", "text": "7?"},
                ],
            },
        ],
        metadata={"ticket": "T-1"},
    )

    assert response.output_text == "alpha answers 1 message(s)"
    assert response.instructions == "Answer in French."
    assert response.metadata == {"ticket": "T-1"}
    assert _question(api, response) == (
        "Instructions:\nAnswer in French.\n\nConversation so far:\nUser: Remember 6.\n"
        "Assistant: OK.\n\nRequest:\nTimes 7?"
    )
    assert _workflow(api, _workflow_id(response))["metadata"] == {"ticket": "T-1"}


def test_a_worker_name_as_model_is_a_pass_through_with_the_conversation(
    client: openai.OpenAI,
) -> None:
    first = client.responses.create(model="alpha", input="Hi", instructions="Be brief.")
    second = client.responses.create(model="alpha", input="Again", previous_response_id=first.id)

    # instructions + the question; then the earlier question and answer + the new question
    # (the earlier instructions are not carried over, as in the OpenAI API)
    assert first.output_text == "alpha answers 2 message(s)"
    assert second.output_text == "alpha answers 3 message(s)"
    assert first.model_extra["conductor"]["worker"] == "alpha"
    assert first.usage is not None
    assert first.usage.input_tokens == 3
    assert client.responses.retrieve(first.id).output_text == first.output_text


# -- streams -------------------------------------------------------------------------------------


def test_a_stream_sends_the_response_events_in_order_with_the_same_answer(
    client: openai.OpenAI,
) -> None:
    plain = client.responses.create(model="conductor-ultra", input=QUESTION)
    events = list(client.responses.create(model="conductor-ultra", input=QUESTION, stream=True))

    kinds = [e.type for e in events]
    assert _deduplicated(kinds) == WORKFLOW_EVENT_ORDER
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text == ANSWER
    created, completed = events[0].response, events[-1].response
    assert created.status == "in_progress"
    assert created.id == completed.id
    assert completed.status == "completed"
    assert completed.output_text == ANSWER
    assert completed.usage is not None
    assert completed.usage.total_tokens == plain.usage.total_tokens  # type: ignore[union-attr]
    # stored: it reads back as it ended
    assert client.responses.retrieve(completed.id).output_text == ANSWER


def test_the_stream_helper_accumulates_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="conductor-ultra", input=QUESTION) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    assert _deduplicated(kinds) == WORKFLOW_EVENT_ORDER
    assert final.output_text == ANSWER
    assert final.status == "completed"


def test_a_pass_through_streams_too(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="alpha", input="Hi", stream=True))
    plain = client.responses.create(model="alpha", input="Hi")

    # one worker's call: its answer, and no reasoning item (there is no workflow to tell of)
    assert _deduplicated([e.type for e in events]) == EVENT_ORDER
    assert events[-1].response.output_text == "alpha answers 1 message(s)"
    assert [item.type for item in events[-1].response.output] == ["message"]  # type: ignore[union-attr]
    assert [item.type for item in plain.output] == ["message"]
    assert [item.type for item in client.responses.retrieve(plain.id).output] == ["message"]


# -- a workflow's progress as a reasoning item ---------------------------------------------------


def test_a_workflows_response_starts_with_its_progress_as_a_reasoning_item(
    api: Api, client: openai.OpenAI
) -> None:
    response = client.responses.create(model="conductor-ultra", input=QUESTION)
    retrieved = client.responses.retrieve(response.id)

    reasoning, message = response.output
    assert reasoning.type == "reasoning"
    assert reasoning.id == f"rs_{response.id.removeprefix('resp_')}"
    assert _summary(reasoning) == PROGRESS
    assert [part.type for part in reasoning.summary] == ["summary_text"] * len(PROGRESS)
    assert (reasoning.status, reasoning.encrypted_content, reasoning.content) == (
        "completed",
        None,
        None,
    )
    assert message.type == "message"
    assert response.output_text == ANSWER  # the message's text alone
    # no answer text and no step's output in the summary
    outputs = [s["output"] for s in response.model_extra["conductor"]["steps"]]
    assert not [t for t in _summary(reasoning) for o in [ANSWER, *outputs] if o and o in t]
    # read back: the same items
    assert _items(retrieved.output) == _items(response.output)


def test_a_streamed_workflow_tells_its_progress_before_its_answer(
    api: Api, client: openai.OpenAI
) -> None:
    with client.responses.stream(model="conductor-ultra", input=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_response()
    raw = _raw_events(api, {"model": "conductor-ultra", "input": QUESTION})

    # every event is one the SDK knows, numbered from 0 without a gap
    stream_event: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    assert [stream_event.validate_python(e).type for e in raw] == [e["type"] for e in raw]
    for numbers in ([e.sequence_number for e in events], [e["sequence_number"] for e in raw]):
        assert numbers == list(range(len(numbers)))
    # the reasoning item first, at output 0, closed before the answer's first text
    kinds = [e.type for e in events]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "reasoning"), (1, "message")]
    reasoning_done = next(i for i, e in enumerate(events) if e.type == "response.output_item.done")
    assert events[reasoning_done].item.type == "reasoning"  # type: ignore[union-attr]
    assert reasoning_done < kinds.index("response.output_text.delta")
    told = [e.text for e in events if e.type == "response.reasoning_summary_text.done"]
    deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert told == deltas == PROGRESS
    assert all(ANSWER not in text for text in told)
    summary_events = [e for e in events if e.type.startswith("response.reasoning_summary")]
    assert {(e.output_index, e.item_id) for e in summary_events} == {(0, added[0].item.id)}  # type: ignore[union-attr]
    # the final response lists the items as streamed; the stored one reads back the same
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert _summary(final.output[0]) == PROGRESS
    assert final.output_text == ANSWER
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert _items(done) == _items(final.output)
    assert _items(client.responses.retrieve(final.id).output) == _items(final.output)
    assert raw[-1]["response"]["output"][0]["summary"] == [
        {"type": "summary_text", "text": text} for text in PROGRESS
    ]


def test_a_second_turn_may_send_the_first_responses_output_back(
    api: Api, client: openai.OpenAI
) -> None:
    """As the Agents SDK and Codex CLI do: the reasoning item is accepted and ignored."""
    first = client.responses.create(model="conductor-ultra", input=QUESTION)
    sent_back: list[Any] = [
        {"role": "user", "content": QUESTION},
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"role": "user", "content": "And doubled?"},
    ]
    assert sent_back[1]["type"] == "reasoning"

    second = client.responses.create(model="conductor-ultra", input=sent_back)
    streamed = list(client.responses.create(model="alpha", input=sent_back, stream=True))
    items = client.responses.input_items.list(second.id, order="asc")

    assert second.output_text == ANSWER
    assert _question(api, second) == (
        f"Conversation so far:\nUser: {QUESTION}\nAssistant: {ANSWER}\n\nRequest:\nAnd doubled?"
    )
    assert [item.type for item in items.data] == ["message"] * 3
    # a worker called directly gets the conversation without it
    assert streamed[-1].response.output_text == "alpha answers 3 message(s)"  # type: ignore[union-attr]


def test_the_async_client_creates_and_streams(api: Api) -> None:
    async def run() -> tuple[Any, list[Any]]:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=api.key, max_retries=0)
        async with client:
            plain, stream = await asyncio.gather(
                client.responses.create(model="conductor-ultra", input=QUESTION),
                client.responses.create(model="conductor-ultra", input=QUESTION, stream=True),
            )
            return plain, [event async for event in stream]

    plain, events = asyncio.run(run())

    assert plain.output_text == ANSWER
    assert events[-1].response.output_text == ANSWER


def _raw_events(api: Api, body: dict[str, Any], key: str | None = None) -> list[dict[str, Any]]:
    """The data of each event of a streamed response, checked against its ``event:`` line."""
    with api.http(key) as http:
        answer = http.post("/v1/responses", json={**body, "stream": True})
    assert answer.status_code == 200, answer.text
    events = []
    for block in answer.text.split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith(":")]
        if not lines:
            continue
        kind, data = lines
        event: dict[str, Any] = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


@pytest.mark.parametrize("model", ["conductor-ultra", "alpha"])
def test_every_event_and_object_validates_against_the_sdk_types(api: Api, model: str) -> None:
    # The SDK parses without validating: a missing or mistyped field shows only here.
    stream_event: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    conversation = [
        {"role": "user", "content": "Remember 6."},
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": QUESTION},
    ]
    events = _raw_events(api, {"model": model, "input": conversation})
    parsed = [stream_event.validate_python(event) for event in events]
    response_id = events[-1]["response"]["id"]
    with api.http() as http:
        retrieved = http.get(f"/v1/responses/{response_id}").json()
        created = _post(api, "/v1/responses", {"model": model, "input": QUESTION}).json()
        items = http.get(f"/v1/responses/{response_id}/input_items", params={"order": "asc"})

    order = EVENT_ORDER if model == "alpha" else WORKFLOW_EVENT_ORDER
    assert _deduplicated([event.type for event in parsed]) == order
    for body in (retrieved, created, events[0]["response"], events[-1]["response"]):
        Response.model_validate(body)
    roles = [TypeAdapter(ResponseItem).validate_python(i).role for i in items.json()["data"]]  # type: ignore[union-attr]
    assert roles == ["user", "assistant", "user"]
    item_ids = {event["item_id"] for event in events if "item_id" in event}
    assert item_ids == {item["id"] for item in events[-1]["response"]["output"]}


def test_a_failed_stream_validates_against_the_sdk_types(api: Api) -> None:
    events = _raw_events(api, {"model": "conductor-ultra", "input": QUESTION}, api.delta_key)

    failed = TypeAdapter(ResponseStreamEvent).validate_python(events[-1])
    assert failed.type == "response.failed"
    assert failed.response.error is not None
    assert "10.20.30.40" not in failed.response.error.message


# -- stored responses ----------------------------------------------------------------------------


def test_previous_response_id_continues_the_stored_conversation(
    api: Api, client: openai.OpenAI
) -> None:
    first = client.responses.create(
        model="conductor-ultra", input=QUESTION, instructions="Be exact."
    )
    second = client.responses.create(
        model="conductor-ultra", input="And doubled?", previous_response_id=first.id
    )
    third = client.responses.create(
        model="conductor-mini", input="Halved?", previous_response_id=second.id
    )

    assert second.previous_response_id == first.id
    assert _question(api, second) == (
        f"Conversation so far:\nUser: {QUESTION}\nAssistant: {ANSWER}\n\nRequest:\nAnd doubled?"
    )
    assert _question(api, third) == (
        f"Conversation so far:\nUser: {QUESTION}\nAssistant: {ANSWER}\nUser: And doubled?\n"
        f"Assistant: {ANSWER}\n\nRequest:\nHalved?"
    )
    assert third.output_text == "alpha answers 1 message(s)"


def _until_status(api: Api, workflow_id: str, status: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        found: str = _workflow(api, workflow_id)["status"]
        if found == status or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_running_response_reads_as_running_and_its_client_going_away_cancels_it(
    api: Api, client: openai.OpenAI
) -> None:
    stream = client.responses.create(
        model="conductor-ultra",
        input=QUESTION,
        stream=True,
        extra_body={"conductor": {"pool": ["slow"]}},  # a minute's step
    )
    created = next(iter(stream))
    response_id = created.response.id
    workflow_id = response_id.removeprefix("resp_")
    assert _until_status(api, workflow_id, "running") == "running"
    running = client.responses.retrieve(response_id)
    with pytest.raises(openai.BadRequestError) as too_early:
        client.responses.create(
            model="conductor-ultra", input="Again", previous_response_id=response_id
        )
    stream.close()  # before the answer

    assert created.type == "response.created"
    assert running.status == "in_progress"
    # no answer yet; its progress so far, once its plan is stored
    assert [(i.type, i.status) for i in running.output] in ([], [("reasoning", "in_progress")])  # type: ignore[union-attr]
    assert too_early.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert _until_status(api, workflow_id, "cancelled") == "cancelled"
    assert client.responses.retrieve(response_id).status == "cancelled"


def test_a_response_sent_with_store_false_cannot_be_read_or_continued(
    client: openai.OpenAI,
) -> None:
    response = client.responses.create(model="conductor-ultra", input=QUESTION, store=False)

    assert response.output_text == ANSWER
    assert response.model_extra["store"] is False
    with pytest.raises(openai.NotFoundError, match="store=false"):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as continued:
        client.responses.create(
            model="conductor-ultra", input="Again", previous_response_id=response.id
        )
    assert continued.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(response.id)


def test_input_items_are_listed_page_by_page(api: Api, client: openai.OpenAI) -> None:
    texts = [f"Line {i}." for i in range(5)]
    response = client.responses.create(
        model="conductor-mini",
        input=[{"role": "user", "content": t} for t in texts],
    )

    first_page = client.responses.input_items.list(response.id, limit=2)
    everything = list(client.responses.input_items.list(response.id, limit=2))
    ascending = client.responses.input_items.list(response.id, order="asc", limit=100)

    assert [item.content[0].text for item in first_page.data] == texts[::-1][:2]  # type: ignore[union-attr]
    assert first_page.has_more is True
    assert first_page.first_id == first_page.data[0].id  # type: ignore[union-attr]
    assert [item.content[0].text for item in everything] == texts[::-1]  # type: ignore[union-attr]
    assert [item.content[0].text for item in ascending.data] == texts  # type: ignore[union-attr]
    assert ascending.has_more is False
    assert all(item.type == "message" and item.role == "user" for item in everything)  # type: ignore[union-attr]
    assert len({item.id for item in everything}) == 5  # type: ignore[union-attr]
    with api.http() as http:
        unknown = http.get(f"/v1/responses/{response.id}/input_items", params={"after": "msg_x"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "after"


@pytest.mark.parametrize("include", ["include", "include[]"])
def test_input_items_refuse_include(api: Api, client: openai.OpenAI, include: str) -> None:
    # input items hold their text only: asked for more, the answer says so rather than
    # returning a page without it
    response = client.responses.create(model="conductor-mini", input=QUESTION)
    with api.http() as http:
        answer = http.get(
            f"/v1/responses/{response.id}/input_items",
            params={include: "message.input_image.image_url"},
        )
        plain = http.get(f"/v1/responses/{response.id}/input_items", params={include: ""})

    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "include"
    assert plain.status_code == 200, plain.text


def test_a_deleted_response_is_gone_and_its_workflow_stays(api: Api, client: openai.OpenAI) -> None:
    response = client.responses.create(model="conductor-ultra", input=QUESTION)
    retrieved = client.responses.retrieve(response.id)

    client.responses.delete(response.id)

    assert retrieved.output_text == ANSWER
    assert retrieved.usage == response.usage
    for read in (
        lambda: client.responses.retrieve(response.id),
        lambda: client.responses.input_items.list(response.id),
        lambda: client.responses.delete(response.id),
        lambda: client.responses.create(
            model="conductor-ultra", input="Again", previous_response_id=response.id
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            read()
    assert _workflow(api, _workflow_id(response))["answer"] == ANSWER  # the trace stays


def test_another_tenants_response_is_not_found(api: Api, client: openai.OpenAI) -> None:
    response = client.responses.create(model="conductor-ultra", input=QUESTION)
    other = api.client(api.other_key)
    calls = (
        lambda: other.responses.retrieve(response.id),
        lambda: other.responses.input_items.list(response.id),
        lambda: other.responses.delete(response.id),
        lambda: other.responses.create(
            model="conductor-ultra", input="Again", previous_response_id=response.id
        ),
    )
    with other:
        for call in calls:
            with pytest.raises(openai.NotFoundError):
                call()
    assert client.responses.retrieve(response.id).output_text == ANSWER  # not deleted


@pytest.mark.parametrize("response_id", ["resp_nope", "nope", f"resp_{'0' * 32}"])
def test_an_unknown_response_id_is_not_found(api: Api, response_id: str) -> None:
    with api.http() as http:
        answer = http.get(f"/v1/responses/{response_id}")
    assert answer.status_code == 404
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


# -- what is refused, and what is accepted -------------------------------------------------------


SDK_DEFAULTS: dict[str, Any] = {
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "truncation": "disabled",
    "temperature": 0.7,
    "top_p": 1.0,
    "user": "user-1",
    "include": [],
    "store": True,
    "text": {"format": {"type": "text"}},
    "reasoning": None,
    "background": False,
    "max_output_tokens": 256,
    "stream_options": None,
    "service_tier": "auto",
    "max_tool_calls": 3,
    "top_logprobs": 0,
}


def test_the_fields_sdks_send_by_default_are_accepted(api: Api) -> None:
    response = _post(
        api, "/v1/responses", {"model": "conductor-ultra", "input": QUESTION, **SDK_DEFAULTS}
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["max_output_tokens"] == 256
    assert body["temperature"] == 0.7
    assert body["user"] == "user-1"
    assert (body["max_tool_calls"], body["top_logprobs"]) == (3, 0)


FILE = {"type": "input_file", "file_id": "file-1"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"reasoning": {"effort": "high", "context": "all_turns"}}, "reasoning.context"),
        ({"text": {"format": {"type": "grammar", "syntax": "lark"}}}, "text.format"),
        ({"background": True}, "background"),
        ({"include": ["reasoning.encrypted_content", "file_search_call.results"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"frobnicate": 1}, "frobnicate"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}, FILE]}]},
            "input.0.content.1",
        ),
        # a reasoning item is ignored: what is left has no user message
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input.0.type"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0"),
        (
            {"input": [*QUESTION_ITEMS, {"type": "function_call_output", "output": "x"}]},
            "input.1.call_id",
        ),
        ({"input": [{"role": "user", "content": "a\x00b"}]}, "input.0.content"),
        ({"input": []}, "input"),
        ({"input": [{"role": "assistant", "content": "Only me."}]}, "input"),
        ({"instructions": "x\x00"}, "instructions"),
        ({"conductor": {"max_steps": 9}}, "conductor.max_steps"),
        ({"metadata": {"k": "v\x00"}}, "metadata.k"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    api: Api, fields: dict[str, Any], param: str
) -> None:
    body = {"model": "conductor-ultra", "input": QUESTION, **fields}
    for model in ("conductor-ultra", "alpha"):
        if model == "alpha" and param.startswith("conductor"):
            continue
        response = _post(api, "/v1/responses", {**body, "model": model})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param, error
        assert param.split(".")[0] in error["message"]


def test_the_sdk_raises_bad_request_for_tools_no_worker_would_take(client: openai.OpenAI) -> None:
    tool: Any = {
        "type": "function",
        "name": "add",
        "parameters": {"type": "object"},
        "strict": True,
    }
    # a worker without tools; a workflow whose pool has only such workers
    for model, pool in (("gamma", None), ("conductor-ultra", ["gamma"])):
        extra = {"conductor": {"pool": pool}} if pool else None
        with pytest.raises(openai.BadRequestError, match="tools") as refused:
            client.responses.create(model=model, input=QUESTION, tools=[tool], extra_body=extra)
        assert refused.value.body["param"] == "tools"  # type: ignore[index]
    told_not_to_call = client.responses.create(
        model="conductor-ultra", input=QUESTION, tools=[tool], tool_choice="none"
    )
    assert told_not_to_call.output_text == ANSWER


def test_an_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.responses.create(model="gpt-nope", input=QUESTION)


# -- failures ------------------------------------------------------------------------------------


def test_a_failed_workflow_is_a_502_not_to_retry_and_a_failed_stream(api: Api) -> None:
    # the official client with its default retries (2)
    with openai.OpenAI(base_url=f"{api.url}/v1", api_key=api.delta_key) as client:
        with pytest.raises(openai.APIStatusError) as failed:
            client.responses.create(model="conductor-ultra", input=QUESTION)
        with pytest.raises(openai.APIStatusError) as passthrough:
            client.responses.create(model="delta", input=QUESTION)
        events = list(client.responses.create(model="conductor-ultra", input=QUESTION, stream=True))
        retrieved = client.responses.retrieve(events[-1].response.id)

    for error in (failed.value, passthrough.value):
        assert error.status_code == 502
        assert error.response.headers["x-should-retry"] == "false"
        assert "10.20.30.40" not in error.message
    # its progress (the plan, the step that failed), then the failure
    assert _deduplicated([e.type for e in events]) == [
        *WORKFLOW_EVENT_ORDER[:8],
        "response.failed",
    ]
    last = events[-1].response
    assert last.status == "failed"
    assert last.error is not None
    assert "failed" in last.error.message
    [plan, step] = _summary(last.output[0])
    assert plan == "Plan (round 1): 1. delta: Solve it."
    assert step.startswith("Step 1 (delta) failed: ")
    assert "10.20.30.40" not in step
    # stored as failed: it reads back so, with its progress and no answer
    assert retrieved.status == "failed"
    assert _items(retrieved.output) == _items(last.output)


# -- /v1/completions -----------------------------------------------------------------------------


def test_a_completion_is_a_chat_completion_of_one_user_message(
    api: Api, client: openai.OpenAI
) -> None:
    completion = client.completions.create(model="conductor-ultra", prompt=QUESTION)
    chunks = list(
        client.completions.create(
            model="conductor-ultra",
            prompt=QUESTION,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert completion.choices[0].text == ANSWER
    assert completion.choices[0].finish_reason == "stop"
    assert _question(api, completion) == QUESTION
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 100
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ANSWER
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == completion.usage.total_tokens
    worker = client.completions.create(model="alpha", prompt=["Hi"])
    assert worker.choices[0].text == "alpha answers 1 message(s)"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"logprobs": 2}, "logprobs"),
        ({"n": 2}, "n"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "a\x00"}, "prompt"),
        ({"model": "gpt-nope"}, "model"),
    ],
)
def test_a_completion_refuses_what_it_cannot_honour(
    api: Api, fields: dict[str, Any], param: str
) -> None:
    response = _post(api, "/v1/completions", {"model": "conductor-ultra", "prompt": "Hi", **fields})
    assert response.status_code == (404 if param == "model" else 400), response.text
    assert response.json()["error"]["param"] == param


# -- the OpenAI Agents SDK and LlamaIndex, with their defaults -----------------------------------


def test_the_agents_sdk_runs_an_agent_on_a_workflow(api: Api) -> None:
    # Imported here: two seconds that the other tests (and collection) need not wait for.
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)

    async def run() -> tuple[Any, Any, Any, Any]:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=api.key)
        async with client:
            agent = Agent(
                name="Calculator",
                instructions="Answer with the number only.",
                model=OpenAIResponsesModel(model="conductor-ultra", openai_client=client),
            )
            result = await Runner.run(agent, QUESTION)
            follow_up = await Runner.run(
                agent, "And doubled?", previous_response_id=result.last_response_id
            )
            # the whole conversation sent again: the earlier output items come back as input
            resent = await Runner.run(
                agent, [*result.to_input_list(), {"role": "user", "content": "And doubled?"}]
            )
            streamed = Runner.run_streamed(agent, QUESTION)
            async for _ in streamed.stream_events():
                pass
            return result, follow_up, resent, streamed

    result, follow_up, resent, streamed = asyncio.run(run())

    assert result.final_output == ANSWER
    assert follow_up.final_output == ANSWER
    assert streamed.final_output == ANSWER
    workflow_id = result.last_response_id.removeprefix("resp_")
    assert _workflow(api, workflow_id)["question"] == (
        f"Instructions:\nAnswer with the number only.\n\nRequest:\n{QUESTION}"
    )
    for continued in (follow_up, resent):
        question = _workflow(api, continued.last_response_id.removeprefix("resp_"))["question"]
        assert question == (
            "Instructions:\nAnswer with the number only.\n\nConversation so far:\n"
            f"User: {QUESTION}\nAssistant: {ANSWER}\n\nRequest:\nAnd doubled?"
        )
    assert resent.final_output == ANSWER


def test_structured_output_answers_the_json_schema_asked_for(api: Api) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}, "unit": {"type": "string"}},
        "required": ["answer", "unit"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "result", "schema": schema, "strict": True}}
    jsoner = {"conductor": {"pool": ["jsoner"]}}

    workflow = api.client().responses.create(
        model="conductor-ultra",
        input=QUESTION,
        text=text,
        extra_body=jsoner,  # type: ignore[arg-type]
    )
    direct = api.client().responses.create(model="jsoner", input=QUESTION, text=text)  # type: ignore[arg-type]

    assert json.loads(workflow.output_text) == JSON_ANSWER
    assert json.loads(direct.output_text) == JSON_ANSWER


def test_the_agents_sdk_gets_its_output_type(api: Api) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from pydantic import BaseModel

    class Result(BaseModel):
        answer: int
        unit: str

    set_tracing_disabled(True)

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=api.key)
        async with client:
            agent = Agent(
                name="Calculator",
                instructions="Compute it.",
                model=OpenAIResponsesModel(model="conductor-ultra", openai_client=client),
                model_settings=ModelSettings(extra_body={"conductor": {"pool": ["jsoner"]}}),
                output_type=Result,
            )
            return await Runner.run(agent, QUESTION)

    result = asyncio.run(run())
    assert result.final_output == Result(answer=42, unit="none")


def test_llamaindex_openai_like_completes_and_chats_with_its_defaults(api: Api) -> None:
    from llama_index.core.llms import ChatMessage as LlamaMessage
    from llama_index.llms.openai_like import OpenAILike

    with httpx.Client() as http:  # closed here: the clients LlamaIndex makes are not
        where = {"api_base": f"{api.url}/v1", "api_key": api.key, "http_client": http}
        completer = OpenAILike(model="conductor-ultra", **where)
        chatter = OpenAILike(model="conductor-ultra", is_chat_model=True, **where)

        completed = completer.complete(QUESTION)
        streamed = list(completer.stream_complete(QUESTION))
        chatted = chatter.chat([LlamaMessage(role="user", content=QUESTION)])

    assert completed.text == ANSWER
    assert streamed[-1].text == ANSWER
    assert chatted.message.content == ANSWER
