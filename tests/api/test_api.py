"""The public API, driven by the official ``openai`` package, httpx and a gRPC client.

The server is the real one on loopback; behind it runs the embedded runtime, or the
distributed one (gRPC planner, aggregator and gateway on the Redis broker, Postgres). Only the
models are scripted: a Conductor that solves with the first worker it is shown and has the
second check, and workers with known answers, so answers and token counts can be checked.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import (  # type: ignore[import-untyped]
    reflection_pb2,
    reflection_pb2_grpc,
)
from sqlalchemy import func, select

from conductor_adapters.rpc.v1 import common_pb2, workflows_pb2, workflows_pb2_grpc
from conductor_adapters.store.keys import KEY_CACHE_S, create_key, revoke_key
from conductor_adapters.store.models import attempt_table, workflow_table
from conductor_api import app as conductor_app
from conductor_api.grpc_service import WorkflowsServicer

from fakes.api_fixture import (
    ANSWER,
    DELTA_URL,
    NAMES,
    QUESTION,
    SLOW_S,
    Api,
    scripted_workers,
)
from fakes.api_server import LiveApi, scripted_service
from fakes.grpc_context import Aborted, GrpcContext
from fakes.metrics import samples
from fakes.scripted import ScriptedWorker


def _workflow(api: Api, workflow_id: str, key: str | None = None) -> dict[str, Any]:
    with api.http(key) as http:
        response = http.get(f"/v1/workflows/{workflow_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _spent(workflow: dict[str, Any]) -> tuple[int, int]:
    """Prompt and completion tokens of every Conductor call and every step."""
    parts = [c["usage"] for c in workflow["planner_calls"]] + [
        s["usage"] for s in workflow["steps"]
    ]
    return sum(p["prompt_tokens"] for p in parts), sum(p["completion_tokens"] for p in parts)


def _check_usage(usage: Any, workflow: dict[str, Any]) -> None:
    prompt, completion = _spent(workflow)
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, completion)
    assert usage.total_tokens == prompt + completion == workflow["usage"]["total_tokens"]
    assert prompt > 100  # the Conductor's 100 and the workers' own


# -- OpenAI SDK ---------------------------------------------------------------------------------


def test_a_chat_completion_is_a_workflow_with_its_usage_and_steps(api: Api) -> None:
    response = api.client().chat.completions.create(model="conductor-ultra", messages=QUESTION)

    assert response.choices[0].message.content == ANSWER
    assert response.choices[0].finish_reason == "stop"
    extra = response.model_extra["conductor"]
    assert [s["worker"] for s in extra["steps"]] == ["alpha", "beta"]
    assert extra["steps"][1]["output"] == ANSWER
    assert extra["status"] == "completed"
    workflow = _workflow(api, extra["workflow_id"])
    assert workflow["answer"] == ANSWER
    assert response.usage is not None
    _check_usage(response.usage, workflow)


def test_a_stream_sends_the_answer_then_usage_then_done(api: Api) -> None:
    stream = api.client().chat.completions.create(
        model="conductor-ultra",
        messages=QUESTION,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"]
    assert len(finals) == 1
    extra = finals[0].model_extra["conductor"]
    assert chunks[0].model_extra["conductor"]["workflow_id"] == extra["workflow_id"]
    _check_usage(chunks[-1].usage, _workflow(api, extra["workflow_id"]))


def test_a_stream_without_include_usage_has_no_usage_chunk(api: Api) -> None:
    chunks = list(
        api.client().chat.completions.create(model="conductor-mini", messages=QUESTION, stream=True)
    )
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "alpha answers 1 message(s)"


def test_the_async_client_streams_and_completes(api: Api) -> None:
    async def run() -> tuple[Any, list[Any]]:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=api.key, max_retries=0)
        async with client:
            plain, stream = await asyncio.gather(
                client.chat.completions.create(model="conductor-ultra", messages=QUESTION),
                client.chat.completions.create(
                    model="conductor-ultra",
                    messages=QUESTION,
                    stream=True,
                    stream_options={"include_usage": True},
                ),
            )
            return plain, [chunk async for chunk in stream]

    plain, chunks = asyncio.run(run())

    assert plain.choices[0].message.content == ANSWER
    _check_usage(plain.usage, _workflow(api, plain.model_extra["conductor"]["workflow_id"]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_a_worker_name_as_model_is_a_plain_pass_through(api: Api) -> None:
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    response = api.client().chat.completions.create(model="alpha", messages=messages)
    chunks = list(
        api.client().chat.completions.create(
            model="alpha", messages=messages, stream=True, stream_options={"include_usage": True}
        )
    )

    assert response.choices[0].message.content == "alpha answers 2 message(s)"
    assert response.model_extra["conductor"]["worker"] == "alpha"
    assert response.usage is not None
    assert response.usage.prompt_tokens == 3  # the scripted worker counts the words it got
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "alpha answers 2 message(s)"
    )
    assert chunks[-1].usage is not None


def test_conversation_and_instructions_reach_the_conductor(api: Api) -> None:
    messages: Any = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Remember 6."},
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": [{"type": "text", "text": "Times 7?"}]},
    ]
    response = api.client().chat.completions.create(model="conductor-mini", messages=messages)
    question = _workflow(api, response.model_extra["conductor"]["workflow_id"])["question"]
    assert question == (
        "Instructions:\nAnswer in French.\n\nConversation so far:\nUser: Remember 6.\n"
        "Assistant: OK.\n\nRequest:\nTimes 7?"
    )


def test_models_lists_variants_and_the_workers_a_key_may_use(api: Api) -> None:
    everything = [m.id for m in api.client().models.list()]
    limited = [m.id for m in api.client(api.alpha_key).models.list()]

    assert everything == ["conductor-mini", "conductor-ultra", *NAMES]
    assert limited == ["conductor-mini", "conductor-ultra", "alpha"]
    assert api.client().models.retrieve("beta").owned_by == "openai-compatible"
    with pytest.raises(openai.NotFoundError):
        api.client(api.alpha_key).models.retrieve("beta")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.client(api.alpha_key).chat.completions.create(model="beta", messages=QUESTION)


# -- keys, tenants, pool options ----------------------------------------------------------------


def test_a_wrong_missing_or_revoked_key_is_401(api: Api) -> None:
    wrong = api.key[:-4] + ("aaaa" if not api.key.endswith("aaaa") else "bbbb")
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        api.client(wrong).chat.completions.create(model="conductor-mini", messages=QUESTION)
    with pytest.raises(openai.AuthenticationError):
        api.client("not-a-key").models.list()
    response = httpx.get(f"{api.url}/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert "conductor keys create" in response.json()["error"]["message"]

    revoked = create_key(api.server.service.engine, "acme")
    assert [m.id for m in api.client(revoked.secret).models.list()]
    assert revoke_key(api.server.service.engine, revoked.key.id)
    # Refused within the second a server trusts a key check for.
    time.sleep(KEY_CACHE_S)
    with pytest.raises(openai.AuthenticationError):
        api.client(revoked.secret).models.list()


def test_another_tenants_workflow_is_not_found(api: Api) -> None:
    response = api.client().chat.completions.create(model="conductor-mini", messages=QUESTION)
    workflow_id = response.model_extra["conductor"]["workflow_id"]

    with api.http(api.other_key) as http:
        for method, path in [
            ("GET", f"/v1/workflows/{workflow_id}"),
            ("GET", f"/v1/workflows/{workflow_id}/events"),
            ("POST", f"/v1/workflows/{workflow_id}/feedback"),
        ]:
            reply = http.request(method, path, json={"score": 1.0} if method == "POST" else None)
            assert reply.status_code == 404, (path, reply.text)
            assert reply.json()["error"]["code"] == "not_found"
    assert _workflow(api, workflow_id)["feedback"] is None  # the other tenant changed nothing
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        metadata = [("authorization", f"Bearer {api.other_key}")]
        for call, request in [
            (stub.Get, workflows_pb2.GetRequest(workflow_id=workflow_id)),
            (
                lambda r, **kw: list(stub.Watch(r, **kw)),
                workflows_pb2.WatchRequest(workflow_id=workflow_id),
            ),
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                call(request, metadata=metadata, timeout=10)
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND


def test_a_pool_option_outside_the_keys_pool_is_400_with_the_reason(api: Api) -> None:
    client = api.client(api.alpha_key)
    with pytest.raises(openai.BadRequestError, match="may not use beta") as caught:
        client.chat.completions.create(
            model="conductor-ultra", messages=QUESTION, extra_body={"conductor": {"pool": ["beta"]}}
        )
    assert "allowed: alpha" in caught.value.message
    # A name outside the pool reads the same to a limited key: the rest of the pool, and which
    # names exist, stay unknown to it (HTTP and gRPC alike)
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model="conductor-ultra", messages=QUESTION, extra_body={"conductor": {"pool": ["nope"]}}
        )
    with (
        grpc.insecure_channel(api.server.grpc_address) as channel,
        pytest.raises(grpc.RpcError) as unknown_grpc,
    ):
        workflows_pb2_grpc.WorkflowsStub(channel).Submit(
            workflows_pb2.SubmitRequest(question="6 * 7", pool=["nope"]),
            metadata=[("authorization", f"Bearer {api.alpha_key}")],
            timeout=10,
        )
    for message in (unknown.value.message, unknown_grpc.value.details() or ""):
        assert "may not use nope (allowed: alpha)" in message
        assert "beta" not in message
    with pytest.raises(openai.BadRequestError, match="not in the pool: nope"):
        api.client().chat.completions.create(
            model="conductor-ultra", messages=QUESTION, extra_body={"conductor": {"pool": ["nope"]}}
        )

    # Without a pool option the key's own pool applies: alpha alone, one step.
    limited = client.chat.completions.create(model="conductor-ultra", messages=QUESTION)
    assert [s["worker"] for s in limited.model_extra["conductor"]["steps"]] == ["alpha"]
    # Within the key's pool, options narrow the workflow.
    narrowed = api.client().chat.completions.create(
        model="conductor-ultra",
        messages=QUESTION,
        extra_body={"conductor": {"pool": ["beta", "alpha"], "max_steps": 1}},
    )
    assert [s["worker"] for s in narrowed.model_extra["conductor"]["steps"]] == ["alpha"]


def test_a_keys_pool_bounds_every_path_its_workers_fallbacks_included(api: Api) -> None:
    """delta is down and falls back to alpha: a key limited to delta never gets alpha's answer,
    not as a pass-through, not in a workflow (chat, job API, gRPC); an unlimited key does."""
    limited = api.client(api.delta_key)
    with pytest.raises(openai.APIStatusError) as passthrough:
        limited.chat.completions.create(model="delta", messages=QUESTION)
    with pytest.raises(openai.APIStatusError) as chat:
        limited.chat.completions.create(model="conductor-ultra", messages=QUESTION)
    with api.http(api.delta_key) as http:
        job = http.post("/v1/workflows", json={"question": "What is 6 * 7?"}).json()["id"]
    _events(api, job)
    metadata = [("authorization", f"Bearer {api.delta_key}")]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        accepted = stub.Submit(
            workflows_pb2.SubmitRequest(question="What is 6 * 7?"), metadata=metadata, timeout=10
        )
        grpc_events = list(
            stub.Watch(
                workflows_pb2.WatchRequest(workflow_id=accepted.workflow_id),
                metadata=metadata,
                timeout=30,
            )
        )
    unlimited = api.client().chat.completions.create(model="delta", messages=QUESTION)

    assert passthrough.value.status_code == chat.value.status_code == 502
    assert "alpha" not in passthrough.value.message
    for workflow_id in (job, accepted.workflow_id):
        workflow = _workflow(api, workflow_id, api.delta_key)
        assert workflow["status"] == "failed"
        assert [a["worker"] for s in workflow["steps"] for a in s["attempts"]] == ["delta"]
    assert grpc_events[-1].WhichOneof("payload") == "failed"
    assert unlimited.model_extra["conductor"]["worker"] == "alpha"  # fallbacks still work


def _workflow_count(api: Api) -> int:
    with api.server.service.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(workflow_table)).scalar_one())


def test_a_failed_workflow_is_one_workflow_under_the_sdks_default_retries(api: Api) -> None:
    # Given the official client with its default retries (2), and a key whose only worker fails
    client = openai.OpenAI(base_url=f"{api.url}/v1", api_key=api.delta_key)
    before = _workflow_count(api)

    # When its workflow fails, and its pass-through call too
    with pytest.raises(openai.APIStatusError) as chat:
        client.chat.completions.create(model="conductor-ultra", messages=QUESTION)
    with pytest.raises(openai.APIStatusError) as passthrough:
        client.chat.completions.create(model="delta", messages=QUESTION)

    # Then the server told it not to retry, so one workflow ran, not three
    for failed in (chat.value, passthrough.value):
        assert failed.status_code == 502
        assert failed.response.headers["x-should-retry"] == "false"
    assert _workflow_count(api) == before + 1


def test_failures_reach_clients_without_internal_addresses_and_the_trace_keeps_them(
    api: Api,
) -> None:
    limited = api.client(api.delta_key)
    with pytest.raises(openai.APIStatusError) as passthrough:
        limited.chat.completions.create(model="delta", messages=QUESTION)
    with pytest.raises(openai.APIStatusError) as chat:
        limited.chat.completions.create(model="conductor-ultra", messages=QUESTION)
    worker_message = passthrough.value.response.json()["error"]["message"]
    workflow_message = chat.value.response.json()["error"]["message"]
    workflow_id = workflow_message.split()[1]
    with api.http(api.delta_key) as http:
        view = http.get(f"/v1/workflows/{workflow_id}").text
        events = http.get(f"/v1/workflows/{workflow_id}/events").text

    for seen in (worker_message, workflow_message, view, events):
        assert "10.20.30.40" not in seen
        assert "[internal address]" in seen
    # One prefix: the message does not name the worker twice before its reason
    assert not worker_message.startswith("delta: delta"), worker_message
    with api.server.service.engine.connect() as conn:
        stored = conn.execute(select(attempt_table.c.error)).scalars().all()
    assert any(DELTA_URL in (error or "") for error in stored)


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"conductor": {"pool": ["nope"]}}, "conductor.pool"),
        ({"messages": [{"role": "user", "content": " "}]}, "messages"),
        ({"model": "conductor-nope"}, "model"),
    ],
    ids=["pool", "empty-question", "unknown-model"],
)
def test_a_refusal_names_the_field_at_fault(api: Api, body: dict[str, Any], param: str) -> None:
    request = {"model": "conductor-ultra", "messages": QUESTION, **body}
    with api.http() as http:
        response = http.post("/v1/chat/completions", json=request)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
@pytest.mark.parametrize(
    "request_fields",
    [
        {"max_steps": 9},
        {"max_steps": 0},
        {"max_steps": -3},
        {"metadata": {f"label-{n}": "x" * 600 for n in range(40)}},
        {"metadata": {"k": "x" * 600}},
    ],
    ids=["max-steps-9", "max-steps-0", "max-steps-negative", "40-labels", "long-label"],
)
def test_grpc_refuses_what_http_refuses(api: Api, request_fields: dict[str, Any]) -> None:
    metadata = [("authorization", f"Bearer {api.key}")]
    before = _workflow_count(api)
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        request = workflows_pb2.SubmitRequest(question="6 * 7", **request_fields)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Submit(request, metadata=metadata, timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert any(word in (refused.value.details() or "") for word in ("max_steps", "metadata"))
    with api.http() as http:
        http_refused = http.post("/v1/workflows", json={"question": "6 * 7", **request_fields})
    assert http_refused.status_code == 400
    assert _workflow_count(api) == before


# -- listing and idempotent submission ----------------------------------------------------------


def _list(api: Api, key: str | None = None, **params: Any) -> dict[str, Any]:
    with api.http(key) as http:
        reply = http.get("/v1/workflows", params=params)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def test_the_job_list_filters_and_pages_through_a_tenants_workflows(api: Api) -> None:
    # Given five jobs of one batch (label), two of them on conductor-mini, all finished
    batch = uuid.uuid4().hex
    made = []
    with api.http() as http:
        for n in range(5):
            variant = "conductor-mini" if n % 2 else "conductor-ultra"
            labels = {"batch": batch}
            job = {"question": f"What is {n} * 7?", "variant": variant, "metadata": labels}
            made.append(http.post("/v1/workflows", json=job).json()["id"])
            time.sleep(0.01)  # distinct creation times, newest last
    for workflow_id in made:
        _events(api, workflow_id)

    # When the tenant lists the batch two at a time, then by variant
    pages, after = [], None
    while True:
        params: dict[str, Any] = {"label": f"batch:{batch}", "limit": 2}
        if after:
            params["after"] = after
        page = _list(api, **params)
        pages.append(page)
        if not page["has_more"]:
            break
        after = page["last_id"]
    mini = _list(api, label=f"batch:{batch}", variant="conductor-mini")
    done = _list(api, label=f"batch:{batch}", status="completed", limit=100)
    other = _list(api, api.other_key, label=f"batch:{batch}")
    future = _list(api, label=f"batch:{batch}", created_after="2999-01-01T00:00:00Z")
    searched = _list(api, label=f"batch:{batch}", q="WHAT 3 *")
    wildcard = _list(api, label=f"batch:{batch}", q="%")

    # Then every job comes once, newest first, with its summary; filters narrow; tenants part
    listed = [w["id"] for page in pages for w in page["data"]]
    assert listed == made[::-1]
    assert [len(page["data"]) for page in pages] == [2, 2, 1]
    first = pages[0]["data"][0]
    assert first["metadata"] == {"batch": batch}
    assert first["status"] == "completed"
    assert first["usage"]["total_tokens"] > 0
    assert "steps" not in first
    assert first["step_count"] == len(_workflow(api, first["id"])["steps"])
    assert [w["id"] for w in mini["data"]] == [made[3], made[1]]
    assert len(done["data"]) == 5
    assert other["data"] == []
    assert future["data"] == []
    assert [w["id"] for w in searched["data"]] == [made[3]]  # every word, any case
    assert wildcard["data"] == []  # a % is a character, not a wildcard


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"label": "no-colon"}, "label"),
        ({"limit": 0}, "limit"),
        ({"status": "sleeping"}, "status"),
        ({"after": str(uuid.UUID(int=7))}, "after"),
    ],
    ids=["label", "limit", "status", "after"],
)
def test_a_bad_list_query_is_a_400_naming_it(api: Api, params: dict[str, Any], param: str) -> None:
    with api.http() as http:
        reply = http.get("/v1/workflows", params=params)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_an_idempotency_key_makes_one_workflow_and_refuses_another_body(api: Api) -> None:
    key = f"order-{uuid.uuid4().hex}"
    job = {"question": "What is 6 * 7?", "metadata": {"order": key}}
    before = _workflow_count(api)
    with api.http() as http:
        first = http.post("/v1/workflows", json=job, headers={"Idempotency-Key": key})
        again = http.post("/v1/workflows", json=job, headers={"Idempotency-Key": key})
        changed = http.post(
            "/v1/workflows",
            json={**job, "question": "What is 7 * 7?"},
            headers={"Idempotency-Key": key},
        )
        fresh = http.post("/v1/workflows", json=job, headers={"Idempotency-Key": key + "-2"})
    with api.http(api.other_key) as http:
        other_tenant = http.post("/v1/workflows", json=job, headers={"Idempotency-Key": key})

    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    assert fresh.json()["id"] != first.json()["id"]
    assert other_tenant.status_code == 202  # keys are per tenant
    assert other_tenant.json()["id"] != first.json()["id"]
    assert _workflow_count(api) == before + 3


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
def test_concurrent_submissions_with_one_idempotency_key_make_one_workflow(api: Api) -> None:
    key = f"race-{uuid.uuid4().hex}"

    async def submit_all() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {api.key}", "Idempotency-Key": key}
        async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=30) as http:
            job = {"question": "What is 6 * 7?"}
            return await asyncio.gather(*(http.post("/v1/workflows", json=job) for _ in range(8)))

    replies = asyncio.run(submit_all())
    assert {r.status_code for r in replies} == {202}
    assert len({r.json()["id"] for r in replies}) == 1


def test_grpc_lists_a_tenants_workflows_as_http_does(api: Api) -> None:
    batch = uuid.uuid4().hex
    metadata = [("authorization", f"Bearer {api.key}")]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        made = [
            stub.Submit(
                workflows_pb2.SubmitRequest(question=f"{n} * 7", metadata={"batch": batch}),
                metadata=metadata,
                timeout=10,
            ).workflow_id
            for n in range(3)
        ]
        for workflow_id in made:
            _until_status(api, workflow_id, "completed")
        first = stub.List(
            workflows_pb2.ListRequest(labels={"batch": batch}, limit=2), metadata=metadata
        )
        rest = stub.List(
            workflows_pb2.ListRequest(
                labels={"batch": batch}, limit=2, after=first.workflows[-1].id
            ),
            metadata=metadata,
        )
        completed = stub.List(
            workflows_pb2.ListRequest(
                labels={"batch": batch}, status=common_pb2.WORKFLOW_STATUS_COMPLETED
            ),
            metadata=metadata,
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.List(workflows_pb2.ListRequest(limit=101), metadata=metadata)

    listed = [w.id for w in [*first.workflows, *rest.workflows]]
    assert sorted(listed) == sorted(made)
    assert len(set(listed)) == 3
    assert (first.has_more, rest.has_more) == (True, False)
    assert dict(first.workflows[0].metadata) == {"batch": batch}
    assert len(completed.workflows) == 3
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_health_and_reflection_list_the_services_as_grpcurl_would(api: Api) -> None:
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        overall = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        workflows = health.Check(
            health_pb2.HealthCheckRequest(service="conductor.v1.Workflows"), timeout=5
        )
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="conductor.v1.Workflows"),
        ]
        listed, described = list(reflection.ServerReflectionInfo(iter(requests), timeout=5))

    serving = health_pb2.HealthCheckResponse.SERVING
    assert overall.status == workflows.status == serving
    names = {service.name for service in listed.list_services_response.service}
    assert names == {
        "conductor.v1.Workflows",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
    # ... and describe them (grpcurl describe): the Workflows service with all its methods
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    services = {s.name: s for f in files for s in f.service}
    assert {m.name for m in services["Workflows"].method} == {
        "Submit",
        "Get",
        "Watch",
        "Cancel",
        "List",
    }


def test_a_reflection_v1_only_client_describes_the_workflows_service(api: Api) -> None:
    # A client that speaks reflection v1 only (tonic's, grpc-java's, Postman): v1's messages
    # are v1alpha's under another package, so v1alpha's classes write and read them.
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        info = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        symbol = "conductor.v1.Workflows"
        ask = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
        [described] = list(info(iter([ask]), timeout=5))

    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    assert "Workflows" in {s.name for f in files for s in f.service}


# -- cancelling ---------------------------------------------------------------------------------

SLOW_JOB = {"question": "What is 6 * 7?", "pool": ["slow"], "metadata": {"ticket": "T-9"}}


def _until_status(api: Api, workflow_id: str, status: str, timeout_s: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        workflow = _workflow(api, workflow_id)
        if workflow["status"] == status or time.monotonic() > deadline:
            return workflow
        time.sleep(0.1)


def _started(api: Api, workflow_id: str) -> None:
    """Waits until the slow worker has its call: the workflow is running a step."""
    running = _until_status(api, workflow_id, "running")
    assert running["status"] == "running", running["status"]
    deadline = time.monotonic() + 20
    while not _workflow(api, workflow_id)["steps"] and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_running_job_is_cancelled_with_its_provider_call(api: Api) -> None:
    # Given a job whose only worker takes a minute, running its step
    api.workers["slow"].cancellation.clear()
    with api.http() as http:
        workflow_id = http.post("/v1/workflows", json=SLOW_JOB).json()["id"]
        _started(api, workflow_id)

        # When its client cancels it, twice
        started = time.monotonic()
        cancelled = http.post(f"/v1/workflows/{workflow_id}/cancel")
        took = time.monotonic() - started
        again = http.post(f"/v1/workflows/{workflow_id}/cancel")
        with api.http(api.other_key) as other_http:
            other = other_http.post(f"/v1/workflows/{workflow_id}/cancel")

    # Then it ends cancelled at once, its step too, and the provider call was stopped
    assert cancelled.status_code == 200, cancelled.text
    view = cancelled.json()
    assert view["status"] == "cancelled"
    assert view["error"] == "cancelled by its client"
    assert [s["status"] for s in view["steps"]] == ["cancelled"]
    assert took < SLOW_S / 4
    assert api.workers["slow"].cancellation.wait(10), "the provider call went on"
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"
    assert other.status_code == 404
    events = _events(api, workflow_id)
    assert events[-1][1] == "cancelled"
    assert events[-1][2]["data"]["status"] == "cancelled"


def test_cancelling_a_finished_workflow_leaves_it_as_it_was(api: Api) -> None:
    with api.http() as http:
        workflow_id = http.post("/v1/workflows", json={"question": "What is 6 * 7?"}).json()["id"]
        _events(api, workflow_id)  # to its end
        reply = http.post(f"/v1/workflows/{workflow_id}/cancel")
    assert reply.status_code == 200
    assert reply.json()["status"] == "completed"


def test_grpc_cancel_ends_the_watch_with_cancelled_and_returns_the_labels(api: Api) -> None:
    metadata = [("authorization", f"Bearer {api.key}")]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        accepted = stub.Submit(
            workflows_pb2.SubmitRequest(question="6 * 7", pool=["slow"], metadata={"t": "1"}),
            metadata=metadata,
            timeout=10,
        )
        _started(api, accepted.workflow_id)
        cancelled = stub.Cancel(
            workflows_pb2.CancelRequest(workflow_id=accepted.workflow_id),
            metadata=metadata,
            timeout=30,
        )
        events = list(
            stub.Watch(
                workflows_pb2.WatchRequest(workflow_id=accepted.workflow_id),
                metadata=metadata,
                timeout=30,
            )
        )
        with pytest.raises(grpc.RpcError) as missing:
            stub.Cancel(
                workflows_pb2.CancelRequest(workflow_id=str(uuid.uuid4())),
                metadata=metadata,
                timeout=10,
            )
    assert cancelled.status == common_pb2.WORKFLOW_STATUS_CANCELLED
    assert dict(cancelled.metadata) == {"t": "1"}
    assert events[-1].WhichOneof("payload") == "cancelled"
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND


def test_a_chat_client_that_goes_away_cancels_its_workflow(api: Api) -> None:
    # Given a chat request whose workflow takes a minute, from a client that waits 2 s
    body = {"model": "conductor-ultra", "messages": QUESTION, "conductor": {"pool": ["slow"]}}
    before = {w["id"] for w in _tenant_workflows(api)}
    with (
        httpx.Client(
            base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}, timeout=2
        ) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        # When it gives up
        http.post("/v1/chat/completions", json=body)

    # Then its workflow is cancelled, not left running for its minute
    [workflow_id] = [w["id"] for w in _tenant_workflows(api) if w["id"] not in before]
    workflow = _until_status(api, workflow_id, "cancelled")
    assert workflow["status"] == "cancelled"
    assert workflow["error"] == "its client went away before the answer"


def test_a_streaming_chat_client_that_goes_away_cancels_its_workflow(api: Api) -> None:
    body = {
        "model": "conductor-ultra",
        "messages": QUESTION,
        "conductor": {"pool": ["slow"]},
        "stream": True,
    }
    with api.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the connection
        first = next(lines)  # the role chunk, with the workflow's id
        workflow_id = json.loads(first.removeprefix("data: "))["conductor"]["workflow_id"]
        _started(api, workflow_id)
    # the stream is closed here, before the answer

    workflow = _until_status(api, workflow_id, "cancelled")
    assert workflow["status"] == "cancelled"


def test_a_job_runs_on_when_its_submitter_disconnects(api: Api) -> None:
    with api.http() as http:
        workflow_id = http.post("/v1/workflows", json={"question": "What is 6 * 7?"}).json()["id"]
    # the client and its connection are gone
    assert _until_status(api, workflow_id, "completed")["status"] == "completed"


def _tenant_workflows(api: Api) -> list[dict[str, Any]]:
    with api.server.service.engine.connect() as conn:
        rows = conn.execute(
            select(workflow_table.c.id).where(workflow_table.c.tenant == "acme")
        ).all()
    return [{"id": str(row.id)} for row in rows]


# -- job API and events -------------------------------------------------------------------------


def _events(api: Api, workflow_id: str, **headers: str) -> list[tuple[int, str, dict[str, Any]]]:
    """Reads the SSE stream to its end: (id, event, data) of each event."""
    events = []
    with (
        api.http() as http,
        http.stream("GET", f"/v1/workflows/{workflow_id}/events", headers=headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if fields:
                    events.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
                fields = {}
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
    return events


def test_events_arrive_in_order_and_a_late_client_gets_them_all(api: Api) -> None:
    with api.http() as http:
        accepted = http.post(
            "/v1/workflows",
            json={"question": "slowly", "pool": ["gamma"], "metadata": {"request": "r-1"}},
        )
    assert accepted.status_code == 202, accepted.text
    workflow_id = accepted.json()["id"]
    started = time.monotonic()

    early = _events(api, workflow_id)  # connects while gamma is still answering
    waited = time.monotonic() - started
    late = _events(api, workflow_id)
    resumed = _events(api, workflow_id, **{"Last-Event-ID": "2"})
    past_the_end = _events(api, workflow_id, **{"Last-Event-ID": "4"})  # ends, never waits

    assert waited >= 0.5  # the early client really waited for the workflow
    kinds = [kind for _, kind, _ in early]
    assert kinds == ["plan", "step_started", "step_finished", "completed"]
    assert [seq for seq, _, _ in early] == [1, 2, 3, 4]
    assert all(data["sequence"] == seq and data["kind"] == kind for seq, kind, data in early)
    assert late == early
    assert resumed == early[2:]
    assert past_the_end == []
    outcome = early[-1][2]["data"]
    assert outcome["answer"] == "gamma answers 1 message(s)"
    workflow = _workflow(api, workflow_id)
    assert workflow["status"] == "completed"
    assert workflow["metadata"] == {"request": "r-1"}
    assert [s["attempts"][0]["status"] for s in workflow["steps"]] == ["ok"]


def test_feedback_is_stored_as_the_workflows_reward(api: Api) -> None:
    with api.http() as http:
        workflow_id = http.post("/v1/workflows", json={"question": "q"}).json()["id"]
        stored = http.post(f"/v1/workflows/{workflow_id}/feedback", json={"score": 0.5})
        refused = http.post(f"/v1/workflows/{workflow_id}/feedback", json={"score": 2})
        quoted = http.post(f"/v1/workflows/{workflow_id}/feedback", json={"score": "1"})
    assert stored.status_code == 200, stored.text
    assert stored.json() == {"id": workflow_id, "object": "workflow.feedback", "score": 0.5}
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "score"
    assert (quoted.status_code, quoted.json()["error"]["param"]) == (400, "score")
    assert _workflow(api, workflow_id)["feedback"] == 0.5


def test_grpc_submit_get_and_watch(api: Api) -> None:
    metadata = [("authorization", f"Bearer {api.key}")]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        accepted = stub.Submit(
            workflows_pb2.SubmitRequest(question="What is 6 * 7?", variant="conductor-ultra"),
            metadata=metadata,
            timeout=10,
        )
        events = list(
            stub.Watch(
                workflows_pb2.WatchRequest(workflow_id=accepted.workflow_id),
                metadata=metadata,
                timeout=30,
            )
        )
        resumed = list(
            stub.Watch(
                workflows_pb2.WatchRequest(
                    workflow_id=accepted.workflow_id, after_sequence=events[-1].sequence
                ),
                metadata=metadata,
                timeout=10,
            )
        )
        workflow = stub.Get(
            workflows_pb2.GetRequest(workflow_id=accepted.workflow_id),
            metadata=metadata,
            timeout=10,
        )
        with pytest.raises(grpc.RpcError) as unauthenticated:
            stub.Get(workflows_pb2.GetRequest(workflow_id=accepted.workflow_id), timeout=10)
        with pytest.raises(grpc.RpcError) as invalid:
            stub.Submit(
                workflows_pb2.SubmitRequest(question="q", pool=["nope"]),
                metadata=metadata,
                timeout=10,
            )

    assert accepted.status == common_pb2.WORKFLOW_STATUS_QUEUED
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert [e.WhichOneof("payload") for e in events][-1] == "completed"
    assert events[-1].completed.answer == ANSWER
    assert resumed == []
    assert workflow.status == common_pb2.WORKFLOW_STATUS_COMPLETED
    assert workflow.answer == ANSWER
    assert [s.worker for s in workflow.steps] == ["alpha", "beta"]
    assert workflow.usage.total_tokens == sum(s.usage.total_tokens for s in workflow.steps) + sum(
        c.usage.total_tokens for c in workflow.planner_calls
    )
    assert unauthenticated.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert invalid.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "nope" in (invalid.value.details() or "")


# -- errors, limits, operations -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        ({"model": "conductor-mini"}, 400, "messages"),
        ({"model": "conductor-mini", "messages": []}, 400, "messages"),
        ({"model": "conductor-mini", "messages": QUESTION, "n": 2}, 400, "n"),
        (
            {"model": "conductor-mini", "messages": [{"role": "system", "content": "x"}]},
            400,
            "user",
        ),
        ({"model": "conductor-mini", "messages": [{"role": "user", "content": " "}]}, 400, "empty"),
        ({"model": "no-such", "messages": QUESTION}, 404, "does not exist"),
        (
            {"model": "conductor-mini", "messages": QUESTION, "conductor": {"max_steps": 9}},
            400,
            "max_steps",
        ),
        (
            {"model": "alpha", "messages": QUESTION, "conductor": {"max_steps": 1}},
            400,
            "single worker",
        ),
        (
            {"model": "conductor-mini", "messages": QUESTION, "conductor": {"max_steps": "1"}},
            400,
            "max_steps",
        ),
        (
            {"model": "conductor-mini", "messages": QUESTION, "conductor": {"max_steps": True}},
            400,
            "max_steps",
        ),
        (
            {"model": "conductor-mini", "messages": QUESTION, "conductor": {"cost_weight": -1}},
            400,
            "cost_weight",
        ),
        ({"model": "conductor-mini", "messages": QUESTION, "stream": "yes"}, 400, "stream"),
        (b"x" * (3 * 1024 * 1024), 413, "over"),
    ],
)
def test_bad_requests_get_openai_error_objects(
    api: Api, body: Any, status: int, fragment: str
) -> None:
    with api.http() as http:
        if isinstance(body, bytes):
            response = http.post(
                "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
            )
        else:
            response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"model": "conductor-mini", "messages": [{"role": "user", "content": "6\x00 * 7"}]},
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {"model": "alpha", "messages": [{"role": "user", "content": "\x00"}]},
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {"model": "conductor-mini", "messages": QUESTION, "metadata": {"k": "v\x00"}},
            "metadata.k",
        ),
        ("/v1/workflows", {"question": "6 * 7\x00"}, "question"),
        (
            "/v1/workflows",
            {"question": "6 * 7", "metadata": {"k\x00": "v"}},
            "metadata.k\x00.[key]",
        ),
    ],
    ids=["chat-message", "pass-through-message", "chat-label", "job-question", "job-label-key"],
)
def test_a_nul_character_from_a_client_is_a_400_naming_the_field(
    api: Api, path: str, body: dict[str, Any], param: str
) -> None:
    """PostgreSQL cannot store NUL, SQLite can: both runtimes and stores refuse it alike."""
    with api.http() as http:
        response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "NUL" in error["message"]
    assert error["param"] == param


def test_a_nul_character_in_a_grpc_submission_is_invalid_argument(api: Api) -> None:
    metadata = [("authorization", f"Bearer {api.key}")]
    requests = [
        workflows_pb2.SubmitRequest(question="6\x00 * 7"),
        workflows_pb2.SubmitRequest(question="6 * 7", metadata={"k": "v\x00"}),
    ]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        for request in requests:
            with pytest.raises(grpc.RpcError) as refused:
                stub.Submit(request, metadata=metadata, timeout=10)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "NUL" in (refused.value.details() or "")


LONE = "6 * 7 \udfff"  # a lone UTF-16 surrogate: JSON can spell it, UTF-8 cannot


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"model": "conductor-mini", "messages": [{"role": "user", "content": LONE}]},
            "messages.0.content",
        ),
        ("/v1/workflows", {"question": LONE}, "question"),
        ("/v1/responses", {"model": "conductor-mini", "input": LONE}, "input.0.content"),
        ("/v1/responses", {"model": "alpha", "input": LONE}, "input.0.content"),
        (
            "/v1/responses",
            {"model": "conductor-mini", "input": [{"role": "user", "content": LONE}]},
            "input.0.content",
        ),
        (
            "/v1/responses",
            {
                "model": "conductor-mini",
                "input": [{"role": "user", "content": [{"type": "input_text", "text": LONE}]}],
            },
            "input.0.content.0.text",
        ),
        ("/v1/completions", {"model": "conductor-mini", "prompt": LONE}, "prompt"),
        ("/v1/completions", {"model": "alpha", "prompt": [LONE]}, "prompt"),
    ],
    ids=[
        "chat",
        "job",
        "responses-string",
        "responses-pass-through",
        "responses-message",
        "responses-part",
        "completions",
        "completions-pass-through",
    ],
)
def test_a_lone_surrogate_from_a_client_is_a_400_naming_the_field(
    api: Api, path: str, body: dict[str, Any], param: str
) -> None:
    """Every door alike: never the 503 (which SDKs retry) or 502 of a failed encoding."""
    with api.http() as http:  # json.dumps escapes it as \udfff, as a JavaScript client would
        response = http.post(
            path, content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error


@pytest.mark.parametrize("query", ["q=a%00b", "variant=a%00", "label=ticket:%00", "label=%00:x"])
async def test_a_nul_in_a_list_filter_is_a_400_naming_it(database_url: str, query: str) -> None:
    """PostgreSQL refuses a NUL in a bound value (it was a 500): refused first, on both stores,
    by the app and the gRPC servicer (in process: no server)."""
    service = scripted_service(database_url, scripted_workers())
    key = create_key(service.engine, "acme").secret
    transport = httpx.ASGITransport(app=conductor_app.create_app(service))
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=auth) as http:
        response = await http.get(f"/v1/workflows?{query}")
    servicer = WorkflowsServicer(service)
    refusals = []
    for request in (
        workflows_pb2.ListRequest(variant="a\x00"),
        workflows_pb2.ListRequest(labels={"ticket": "\x00"}),
        workflows_pb2.ListRequest(labels={"\x00": "x"}),
    ):
        context = GrpcContext(key)
        with pytest.raises(Aborted):
            await servicer.List(request, context)
        refusals.append(context)
    service.engine.dispose()

    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == query.split("=")[0]
    assert "NUL" in response.json()["error"]["message"]
    for refusal in refusals:
        assert refusal.code is grpc.StatusCode.INVALID_ARGUMENT, refusal.details
        assert "NUL" in refusal.details
        assert "SELECT" not in refusal.details


@pytest.mark.parametrize(
    "wire",
    [
        # A string field (Submit's question, List's variant) of 2 bytes that are not UTF-8
        {"Submit": b"\x0a\x02\xff\xfe", "List": b"\x12\x02\xff\xfe"},
        {"Submit": b"\x0a\x50abc", "List": b"\x12\x50abc"},  # 80 bytes announced, 3 sent
        dict.fromkeys(("Submit", "List"), b"\xff" * 11),  # a tag no varint can end
    ],
    ids=["not-utf8", "truncated", "bad-varint"],
)
def test_a_malformed_grpc_message_is_invalid_argument(api: Api, wire: dict[str, bytes]) -> None:
    metadata = [("authorization", f"Bearer {api.key}")]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        for method, message in wire.items():  # raw bytes: no serializer on the client's side
            call = channel.unary_unary(f"/conductor.v1.Workflows/{method}")
            with pytest.raises(grpc.RpcError) as refused:
                call(message, metadata=metadata, timeout=10)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, refused.value
            details = refused.value.details() or ""
            assert "not a valid message" in details
            assert "DecodeError" not in details
            assert "Exception" not in details


def test_a_negative_or_nan_cost_weight_in_a_grpc_submission_is_invalid_argument(api: Api) -> None:
    metadata = [("authorization", f"Bearer {api.key}")]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        for weight in (-0.5, float("nan")):
            request = workflows_pb2.SubmitRequest(question="6 * 7", cost_weight=weight)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Submit(request, metadata=metadata, timeout=10)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "cost_weight must be a number >= 0" in (refused.value.details() or "")


def test_health_readiness_metrics_and_openapi(api: Api) -> None:
    api.client().chat.completions.create(model="conductor-mini", messages=QUESTION)
    with httpx.Client(base_url=api.url, timeout=10) as http:
        health, ready = http.get("/healthz"), http.get("/readyz")
        schema = http.get("/openapi.json")
        unknown = http.get("/v1/nothing-here")
        # Pages that would load scripts from a CDN: not served
        viewers = [http.get(path).status_code for path in ("/docs", "/redoc")]
        # Every tenant's figures: not on the clients' port once keys exist, key or none
        key = {"Authorization": f"Bearer {api.key}"}
        public = [http.get("/metrics"), http.get("/metrics", headers=key)]
    with httpx.Client(base_url=api.server.metrics_url, timeout=10) as http:
        metrics = http.get("/metrics")
        port_probes = http.get("/healthz"), http.get("/readyz")

    assert health.json() == {"status": "ok"}
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"
    for refused in public:
        assert refused.status_code == 403
        assert "CONDUCTOR_METRICS_PORT" in refused.json()["error"]["message"]
        assert "conductor_api_tokens" not in refused.text
    assert [probe.status_code for probe in port_probes] == [200, 200]
    assert 'route="/v1/chat/completions",status="200"' in metrics.text
    assert "conductor_workflows_submitted_total" in metrics.text
    # The completion's workflow, its tokens and cost, by tenant and variant (the module's
    # other tests add to them: at least this one)
    scraped = samples(metrics.text)
    mini = ("variant", "conductor-mini")
    ended = ("conductor_api_workflows_total", (("outcome", "completed"), mini))
    prompt = ("conductor_api_tokens_total", (("kind", "prompt"), ("tenant", "acme"), mini))
    assert scraped[ended] >= 1
    assert scraped[prompt] > 0
    assert ("conductor_api_cost_usd_total", (("tenant", "acme"), mini)) in scraped
    paths = schema.json()["paths"]
    assert {
        "/v1/chat/completions",
        "/v1/models",
        "/v1/workflows",
        "/v1/workflows/{workflow_id}",
        "/v1/workflows/{workflow_id}/events",
        "/v1/workflows/{workflow_id}/feedback",
    } <= set(paths)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"
    assert viewers == [404, 404]


def test_every_operation_documents_what_it_answers(api: Api) -> None:
    with httpx.Client(base_url=api.url, timeout=10) as http:
        document = http.get("/openapi.json").json()
    missing = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                contents = response.get("content") or {}
                if not contents or any(not c.get("schema") for c in contents.values()):
                    missing.append(f"{method.upper()} {path} {status}")
    assert missing == []
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert chat["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletion"}
    assert "text/event-stream" in chat


def test_a_workflow_id_that_is_not_a_uuid_is_400(api: Api) -> None:
    with api.http() as http:
        response = http.get("/v1/workflows/not-a-uuid")
        missing = http.get(f"/v1/workflows/{uuid.uuid4()}")
    assert response.status_code == 400
    assert missing.status_code == 404


# -- open mode (embedded only) ------------------------------------------------------------------


def test_an_open_server_takes_any_key_until_one_exists(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    server = LiveApi(lambda: scripted_service(url, scripted_workers()), open_access=True)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="anything", max_retries=0)
        response = client.chat.completions.create(model="conductor-mini", messages=QUESTION)
        with httpx.Client(base_url=server.url) as http:
            open_metrics = http.get("/metrics")  # one tenant, the local one: served
        made = create_key(server.service.engine, "acme")
        time.sleep(KEY_CACHE_S)  # the open answer is reused this long
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/metrics").status_code == 403
        assert open_metrics.status_code == 200
        assert "conductor_http_requests_total" in open_metrics.text
        keyed = openai.OpenAI(base_url=f"{server.url}/v1", api_key=made.secret, max_retries=0)
        assert keyed.models.list().data
        # The open workflow belongs to tenant "default", not to the new key's tenant.
        with httpx.Client(base_url=server.url) as http:
            workflow_id = response.model_extra["conductor"]["workflow_id"]
            reply = http.get(
                f"/v1/workflows/{workflow_id}", headers={"Authorization": f"Bearer {made.secret}"}
            )
        assert reply.status_code == 404
    finally:
        server.close()


def test_an_open_server_answers_loopback_host_names_only(tmp_path: Path) -> None:
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 sends its own name as Host."""
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    server = LiveApi(lambda: scripted_service(url, scripted_workers()), open_access=True)
    try:
        port = server.url.rsplit(":", 1)[1]
        with httpx.Client(base_url=server.url, timeout=10) as http:
            answered = {
                host: http.get("/v1/models", headers={"Host": host}).status_code
                for host in (f"localhost:{port}", "127.0.0.1", f"[::1]:{port}", "LOCALHOST")
            }
            rebound = http.get("/v1/models", headers={"Host": f"attacker.example:{port}"})
            ui = http.get("/ui/", headers={"Host": "attacker.example"})
            probe = http.get("/healthz", headers={"Host": "10.1.2.3:8000"})
        create_key(server.service.engine, "acme")
        time.sleep(KEY_CACHE_S)  # the open answer is reused this long
        with httpx.Client(base_url=server.url, timeout=10) as http:
            keyed = http.get("/v1/models", headers={"Host": "attacker.example"})
    finally:
        server.close()

    assert set(answered.values()) == {200}, answered
    assert rebound.status_code == 403
    error = rebound.json()["error"]
    assert error["code"] == "host_not_allowed"
    assert "CONDUCTOR_ALLOWED_HOSTS" in error["message"]
    assert ui.status_code == 403
    assert probe.status_code == 200
    # Once a key exists, any Host: the key is what a rebinding page cannot present.
    assert keyed.status_code == 401


def test_allowed_hosts_are_answered_and_others_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    server = LiveApi(
        lambda: scripted_service(url, scripted_workers()),
        open_access=True,
        allowed_hosts=["conductor.example.com", "*.internal.example"],
    )
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            status = {
                host: http.get("/v1/models", headers={"Host": host}).status_code
                for host in (
                    "Conductor.Example.com:443",
                    "api.internal.example",
                    "localhost",
                    "example.com",
                    "conductor.example.com.evil.example",
                )
            }
    finally:
        server.close()

    assert status == {
        "Conductor.Example.com:443": 200,
        "api.internal.example": 200,
        "localhost": 200,
        "example.com": 403,
        "conductor.example.com.evil.example": 403,
    }


def test_cors_answers_the_configured_origins_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    allowed = "https://app.example.com"
    server = LiveApi(
        lambda: scripted_service(url, scripted_workers()), open_access=True, cors_origins=[allowed]
    )
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            preflight = {
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            }
            ok = http.options("/v1/chat/completions", headers={"Origin": allowed, **preflight})
            other = http.options(
                "/v1/chat/completions", headers={"Origin": "https://evil.example", **preflight}
            )
            refused = http.get("/v1/models", headers={"Origin": allowed})  # no key: 401
    finally:
        server.close()

    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == allowed
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-origin" not in other.headers
    # A refusal is readable by the page that asked (open mode takes any key: 200 here)
    assert refused.headers["access-control-allow-origin"] == allowed


def test_a_streamed_body_over_the_limit_is_413(api: Api) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts as it reads
        yield b'{"model": "conductor-mini", "messages": [{"role": "user", "content": "'
        for _ in range(48):
            yield b"x" * 65536
        yield b'"}]}'

    with api.http() as http:
        response = http.post(
            "/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_body_that_stalls_is_408_and_the_connection_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that stops mid-upload no longer holds the connection for as long as it likes."""
    monkeypatch.setattr(conductor_app, "BODY_STALL_S", 0.5)
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    server = LiveApi(lambda: scripted_service(url, scripted_workers()), open_access=True)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            started = time.monotonic()
            conn.sendall(
                b"POST /v1/workflows HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                b'{"question": "6 *'  # and nothing more
            )
            reply = b""
            while chunk := conn.recv(65536):  # until the server closes the connection
                reply += chunk
            waited = time.monotonic() - started
    finally:
        server.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"request_timeout" in reply
    assert waited < 5


def test_a_complete_body_is_not_timed_out_while_its_answer_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the body is in, reads wait for the client's disconnect: a stream outlives the stall."""
    monkeypatch.setattr(conductor_app, "BODY_STALL_S", 0.2)
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    workers = [ScriptedWorker("alpha", delay_s=1.0, answer=lambda _: "slow and sure")]
    server = LiveApi(lambda: scripted_service(url, workers), open_access=True)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="any", max_retries=0)
        stream = client.chat.completions.create(model="alpha", messages=QUESTION, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    finally:
        server.close()
    assert text == "slow and sure"
