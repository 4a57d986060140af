"""A streamed answer's text as its worker writes it: chat completions and the Responses API on
a variant, read with the openai SDK, and the job API's events (httpx) and gRPC Watch of a
workflow submitted with stream_answer, on both runtimes (distributed: from the gateway to the
API through Redis). teller, streamed, writes its answer a word every 0.05 s: the first word
reaches the client while teller is still writing."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import grpc
import pytest

from conductor_adapters.rpc.v1 import workflows_pb2, workflows_pb2_grpc

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
    summary: list[str] = []
    output: list[Any] = []
    for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            if writing_when_first_came is None:
                writing_when_first_came = teller.calls[-1].finished == 0.0
            deltas.append(event.delta)
        elif event.type == "response.reasoning_summary_text.done":
            summary.append(event.text)
        elif event.type == "response.completed":
            done_text = event.response.output_text
            output = event.response.output

    assert "".join(deltas) == TOLD
    assert done_text == TOLD
    # numbered from 0 without a gap, the response created first, as the SDK expects
    assert numbers == list(range(len(numbers)))
    assert kinds[0] == "response.created"
    assert writing_when_first_came is True
    # the workflow's plan first, as a reasoning item closed before the answer's text began
    assert summary == ["Plan (round 1): 1. teller: Solve it."]
    reasoning_done = kinds.index("response.output_item.done")
    assert kinds.index("response.reasoning_summary_text.done") < reasoning_done
    assert reasoning_done < kinds.index("response.output_text.delta")
    assert [item.type for item in output] == ["reasoning", "message"]
    assert [part.text for part in output[0].summary] == summary


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


# -- the job API's events and gRPC Watch ----------------------------------------------------

DELTA = "answer.delta"
Frame = tuple[int | None, str, dict[str, Any]]  # SSE id (None: none), event, data


def _job(api: Api, **fields: Any) -> str:
    body = {"question": "What is 6 * 7?", "variant": "conductor-ultra", "pool": ["teller"]}
    with api.http() as http:
        accepted = http.post("/v1/workflows", json={**body, **fields})
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["id"])


def _job_events(
    api: Api,
    workflow_id: str,
    teller: ScriptedWorker,
    *,
    until_delta: bool = False,
    headers: dict[str, str] | None = None,
) -> tuple[list[Frame], bool | None]:
    """The events stream's frames, to its end (``until_delta``: to the first delta after a
    stored event), and whether teller was still writing when the first delta came (None: none
    came). A delta may come before the step's events: those are stored after a batch's
    commit, the pieces passed on at once."""
    frames: list[Frame] = []
    writing_when_first_came: bool | None = None
    with (
        api.http() as http,
        http.stream("GET", f"/v1/workflows/{workflow_id}/events", headers=headers) as response,
    ):
        assert response.status_code == 200
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if not fields:
                continue
            sequence = int(fields["id"]) if "id" in fields else None
            frames.append((sequence, fields["event"], json.loads(fields["data"])))
            fields = {}
            if frames[-1][1] == DELTA:
                if writing_when_first_came is None:
                    writing_when_first_came = teller.calls[-1].finished == 0.0
                if until_delta and any(sequence is not None for sequence, _, _ in frames):
                    break
    return frames, writing_when_first_came


def _check_pieces(pieces: list[tuple[str, int]]) -> str:
    """The answer the pieces (text, offset) make, each offset the length of those before."""
    told = ""
    for text, offset in pieces:
        assert offset == len(told)
        told += text
    return told


def test_job_events_carry_the_answer_as_the_worker_writes_it(api: Api) -> None:
    teller = api.workers["teller"]
    workflow_id = _job(api, stream_answer=True)

    frames, writing_when_first_came = _job_events(api, workflow_id, teller)

    deltas = [(sequence, data) for sequence, kind, data in frames if kind == DELTA]
    stored = [(sequence, kind) for sequence, kind, _ in frames if kind != DELTA]
    assert writing_when_first_came is True
    # the stored events as ever, numbered without a gap and ending with the outcome...
    assert [sequence for sequence, _ in stored] == list(range(1, len(stored) + 1))
    assert frames[-1][1] == "completed"
    # ...and the pieces between them, without an id, all of them before the outcome
    assert all(sequence is None for sequence, _ in deltas)
    assert all(data["workflow_id"] == workflow_id for _, data in deltas)
    assert len(deltas) == len(TOLD.split(" "))
    told = _check_pieces([(data["text"], data["offset"]) for _, data in deltas])
    assert told == frames[-1][2]["data"]["answer"] == TOLD


def test_job_events_without_stream_answer_have_no_deltas(api: Api) -> None:
    teller = api.workers["teller"]
    streams = teller.streams
    workflow_id = _job(api)

    frames, _ = _job_events(api, workflow_id, teller)

    assert [kind for _, kind, _ in frames if kind == DELTA] == []
    assert [sequence for sequence, _, _ in frames] == list(range(1, len(frames) + 1))
    assert frames[-1][2]["data"]["answer"] == TOLD
    assert teller.streams == streams  # its step was called whole


def _submit_streamed(stub: Any, metadata: list[tuple[str, str]]) -> Any:
    """A job on teller over gRPC whose answer is streamed on its events."""
    request = workflows_pb2.SubmitRequest(
        question="What is 6 * 7?", variant="conductor-ultra", pool=["teller"], stream_answer=True
    )
    return stub.Submit(request, metadata=metadata, timeout=10)


def test_grpc_watch_carries_the_answer_as_the_worker_writes_it(api: Api) -> None:
    teller = api.workers["teller"]
    metadata = [("authorization", f"Bearer {api.key}")]
    events = []
    writing_when_first_came: bool | None = None
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        accepted = _submit_streamed(stub, metadata)
        request = workflows_pb2.WatchRequest(workflow_id=accepted.workflow_id)
        for event in stub.Watch(request, metadata=metadata, timeout=30):
            if event.WhichOneof("payload") == "answer_delta" and writing_when_first_came is None:
                writing_when_first_came = teller.calls[-1].finished == 0.0
            events.append(event)

    kinds = [e.WhichOneof("payload") for e in events]
    deltas = [e for e in events if e.WhichOneof("payload") == "answer_delta"]
    stored = [e for e in events if e.WhichOneof("payload") != "answer_delta"]
    assert writing_when_first_came is True
    assert [e.sequence for e in stored] == list(range(1, len(stored) + 1))
    assert kinds[-1] == "completed"
    assert len(deltas) == len(TOLD.split(" "))
    # a delta is numbered as the last stored event before it: a resume point
    last_stored = 0
    for event in events:
        if event.WhichOneof("payload") == "answer_delta":
            assert event.sequence == last_stored
            assert event.workflow_id == accepted.workflow_id
        else:
            last_stored = event.sequence
    told = _check_pieces([(e.answer_delta.text, e.answer_delta.offset) for e in deltas])
    assert told == events[-1].completed.answer == TOLD


def test_a_resumed_stream_gets_the_answer_again_from_its_start(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that goes away while the answer is written and comes back with the last
    sequence it saw gets the stored events after it, and the pieces from the start."""
    teller = api.workers["teller"]
    monkeypatch.setattr(teller, "word_delay_s", 0.3)  # 1.2 s of writing: time to come back
    metadata = [("authorization", f"Bearer {api.key}")]

    # The job API: gone at a piece, back with Last-Event-ID
    workflow_id = _job(api, stream_answer=True)
    first, _ = _job_events(api, workflow_id, teller, until_delta=True)
    seen = max(sequence for sequence, _, _ in first if sequence is not None)
    resumed, writing_when_first_came = _job_events(
        api, workflow_id, teller, headers={"Last-Event-ID": str(seen)}
    )
    stored = [sequence for sequence, kind, _ in resumed if kind != DELTA]
    assert writing_when_first_came is True
    assert stored == list(range(seen + 1, seen + 1 + len(stored)))
    assert resumed[-1][1] == "completed"
    pieces = [(data["text"], data["offset"]) for _, kind, data in resumed if kind == DELTA]
    assert _check_pieces(pieces) == TOLD

    # gRPC: gone at a piece after a stored event, back with its sequence as after_sequence
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        accepted = _submit_streamed(stub, metadata)
        request = workflows_pb2.WatchRequest(workflow_id=accepted.workflow_id)
        call = stub.Watch(request, metadata=metadata, timeout=30)
        after = None
        for event in call:
            if event.WhichOneof("payload") == "answer_delta" and event.sequence > 0:
                after = event.sequence
                break
        call.cancel()
        assert after is not None, "no piece came after a stored event"
        request = workflows_pb2.WatchRequest(workflow_id=accepted.workflow_id, after_sequence=after)
        again = list(stub.Watch(request, metadata=metadata, timeout=30))
    deltas = [e.answer_delta for e in again if e.WhichOneof("payload") == "answer_delta"]
    stored = [e.sequence for e in again if e.WhichOneof("payload") != "answer_delta"]
    assert stored == list(range(after + 1, after + 1 + len(stored)))
    assert again[-1].WhichOneof("payload") == "completed"
    assert _check_pieces([(d.text, d.offset) for d in deltas]) == TOLD
