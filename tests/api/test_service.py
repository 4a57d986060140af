"""The API's rules, in the service every door calls, without a server: ``WorkflowService``
over a runtime in memory (tests/fakes/memory_runtime.py), and the doors driven in process
(the ASGI app through httpx, the gRPC servicer with a stand-in context). The end-to-end tests
per door (tests/api/test_api.py and others) run the real server over both runtimes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy import Engine, func, select

from conductor.chat import ChatMessage
from conductor.errors import InvalidRequest, WorkerUnavailable
from conductor.pool import Price
from conductor.variants import BUILTIN_VARIANTS
from conductor_adapters.rpc.v1 import workflows_pb2
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import KeyLimits, create_key
from conductor_adapters.store.models import direct_call_table
from conductor_api.app import create_app
from conductor_api.errors import ApiError
from conductor_api.grpc_service import WorkflowsServicer
from conductor_api.reads import WorkflowFilter
from conductor_api.rules import CHAT_FIELDS, Caller, request_hash
from conductor_api.schemas import WorkflowSubmission
from conductor_api.service import WorkflowService

from fakes.grpc_context import Aborted, GrpcContext
from fakes.memory_runtime import MemoryRuntime
from fakes.scripted import ScriptedWorker, named_pool, scripted_gateway

DOWN_URL = "http://10.20.30.40:8000/v1/chat/completions"
QUESTION = "What is 6 * 7?"
CHAT = {"model": "conductor-ultra", "messages": [{"role": "user", "content": QUESTION}]}
RESPONSE = {"model": "conductor-ultra", "input": QUESTION}
COMPLETION = {"model": "conductor-ultra", "prompt": QUESTION}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated trace database, copied for each test (migrating takes seconds)."""
    path = tmp_path_factory.mktemp("service") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def engine(template: Path, tmp_path: Path) -> Iterator[Engine]:
    path = tmp_path / "conductor.db"
    shutil.copy(template, path)
    engine = make_engine(f"sqlite:///{path}")
    yield engine
    engine.dispose()


def _service(engine: Engine, *, answers: bool = False) -> WorkflowService:
    workers = [
        ScriptedWorker("alpha"),
        ScriptedWorker("beta"),
        ScriptedWorker("down", fail_with=WorkerUnavailable(f"down is down at {DOWN_URL}")),
    ]
    pool = named_pool([w.name for w in workers], Price(input=1.0, output=2.0))
    gateway = scripted_gateway(pool, {w.name: w for w in workers})
    answer = (lambda request: f"answer to {request.question}") if answers else None
    runtime = MemoryRuntime(engine, pool, gateway, answer=answer)
    return WorkflowService(runtime, BUILTIN_VARIANTS, "conductor-ultra")


@pytest.fixture
def service(engine: Engine) -> WorkflowService:
    return _service(engine)


def _runtime(service: WorkflowService) -> MemoryRuntime:
    assert isinstance(service.runtime, MemoryRuntime)
    return service.runtime


def _count(service: WorkflowService, name: str, **labels: str) -> float:
    value = service.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def _keyed(engine: Engine, limits: KeyLimits | None = None, **kwargs: Any) -> Caller:
    made = create_key(engine, "acme", limits=limits, **kwargs)
    pool = made.key.allowed_pool
    return Caller(
        tenant="acme",
        key_id=made.key.id,
        limits=made.key.limits,
        allowed_pool=tuple(pool) if pool is not None else None,
    )


# -- rules --------------------------------------------------------------------------------------


async def test_a_submission_is_checked_before_anything_is_recorded_and_names_the_doors_field(
    service: WorkflowService,
) -> None:
    caller = Caller(tenant="acme")
    cases = [
        ({"variant": "conductor-huge"}, "variant"),
        ({"max_steps": 9}, "max_steps"),
        ({"cost_weight": -1.0}, "cost_weight"),
        ({"pool": ["alpha", "omega"]}, "pool"),
        ({"metadata": {"": "x"}}, "metadata"),
    ]
    for options, param in cases:
        with pytest.raises(InvalidRequest) as refused:
            await service.start_workflow(caller, QUESTION, **options)
        assert refused.value.param == param, options
    # The same rule, named as Chat Completions names it
    with pytest.raises(InvalidRequest) as refused:
        await service.start_workflow(caller, QUESTION, pool=["omega"], fields=CHAT_FIELDS)
    assert refused.value.param == "conductor.pool"
    with pytest.raises(InvalidRequest) as refused:
        await service.start_workflow(caller, "   ", fields=CHAT_FIELDS)
    assert refused.value.param == "messages"
    assert _runtime(service).submitted == []


async def test_a_key_limited_to_some_workers_learns_nothing_of_the_others(
    service: WorkflowService, engine: Engine
) -> None:
    caller = _keyed(engine, allowed_pool=["alpha"])
    with pytest.raises(InvalidRequest, match="may not use beta") as refused:
        await service.start_workflow(caller, QUESTION, pool=["beta"])
    assert "allowed: alpha" in str(refused.value)
    # an unknown name gets the same answer as a known one
    with pytest.raises(InvalidRequest, match="may not use omega"):
        await service.start_workflow(caller, QUESTION, pool=["omega"])
    # no pool named: the key's
    started = await service.start_workflow(caller, QUESTION)
    assert _runtime(service).submitted[-1].pool == ["alpha"]
    assert started.status == "queued"
    # a worker it may not call directly does not exist for it
    with pytest.raises(ApiError) as missing:
        await service.call_worker(caller, "beta", [])
    assert missing.value.status == 404
    assert missing.value.code == "model_not_found"
    assert service.allowed_workers(caller) == ["alpha"]


async def test_a_callback_needs_a_signing_key_and_an_idempotency_key_is_printable(
    service: WorkflowService,
) -> None:
    caller = Caller(tenant="acme")
    with pytest.raises(InvalidRequest, match="no webhook signing secret") as refused:
        await service.start_workflow(caller, QUESTION, callback_url="https://example.com/hook")
    assert refused.value.param == "callback_url"
    with pytest.raises(InvalidRequest) as refused:
        await service.start_workflow(caller, QUESTION, idempotency_key="has spaces")
    assert refused.value.param == "Idempotency-Key"
    assert _runtime(service).submitted == []


# -- admission ----------------------------------------------------------------------------------


async def test_admission_counts_only_requests_that_pass_their_own_checks(
    service: WorkflowService, engine: Engine
) -> None:
    caller = _keyed(engine, KeyLimits(rpm_limit=1))
    # a request refused for its own fault costs nothing of the key's rate
    with pytest.raises(InvalidRequest):
        await service.start_workflow(caller, QUESTION, variant="conductor-huge")
    started = await service.start_workflow(caller, QUESTION)
    assert started.limit_headers["x-ratelimit-limit-requests"] == "1"
    assert started.limit_headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(ApiError) as refused:
        await service.start_workflow(caller, QUESTION)
    assert refused.value.status == 429
    assert refused.value.code == "rate_limit_exceeded"
    assert "Retry-After" in refused.value.headers
    # a direct call is admitted by the same window
    with pytest.raises(ApiError) as refused_call:
        await service.call_worker(caller, "alpha", [])
    assert refused_call.value.code == "rate_limit_exceeded"
    assert len(_runtime(service).submitted) == 1
    refusals = "conductor_api_key_limit_refusals_total"
    assert _count(service, refusals, reason="rate_limit_exceeded") == 2
    assert _count(service, "conductor_workflows_submitted_total", variant="conductor-ultra") == 1


async def test_workflows_at_once_are_limited_and_freed_when_one_ends(
    service: WorkflowService, engine: Engine
) -> None:
    caller = _keyed(engine, KeyLimits(max_concurrent=1))
    first = await service.start_workflow(caller, QUESTION)
    with pytest.raises(ApiError) as busy:
        await service.start_workflow(caller, QUESTION)
    assert busy.value.code == "concurrency_limit_exceeded"
    # a direct call is not a workflow: it is not held back
    call, _ = await service.call_worker(caller, "alpha", [])
    assert (await call()).text
    _runtime(service).finish(first.workflow_id, answer="42")
    await service.start_workflow(caller, QUESTION)


async def test_a_spent_budget_refuses_work_and_the_metrics_see_what_is_left(
    service: WorkflowService, engine: Engine
) -> None:
    caller = _keyed(engine, KeyLimits(budget_usd=1.0, budget_period="day"))
    first = await service.start_workflow(caller, QUESTION)
    assert first.limit_headers["x-conductor-budget-remaining-usd"] == "1.000000"
    _runtime(service).finish(first.workflow_id, answer="42", cost_usd=1.5)
    with pytest.raises(ApiError) as spent:
        await service.start_workflow(caller, QUESTION)
    assert spent.value.code == "budget_exceeded"
    assert spent.value.retry is False
    gauge = "conductor_api_key_budget_remaining_usd"
    assert caller.key_id is not None
    assert _count(service, gauge, key_id=caller.key_id) == 0.0


# -- idempotency --------------------------------------------------------------------------------


async def test_an_idempotency_key_makes_one_workflow_and_refuses_another_request(
    service: WorkflowService,
) -> None:
    caller = Caller(tenant="acme")
    first = await service.start_workflow(caller, QUESTION, idempotency_key="job-1")
    again = await service.start_workflow(caller, QUESTION, idempotency_key="job-1")
    assert again.workflow_id == first.workflow_id
    assert again.replayed
    assert not first.replayed
    assert again.status == "queued"
    with pytest.raises(ApiError) as reused:
        await service.start_workflow(caller, "Another question?", idempotency_key="job-1")
    assert reused.value.status == 409
    assert reused.value.code == "idempotency_key_reused"
    # keys are the tenant's
    other = await service.start_workflow(Caller(tenant="globex"), QUESTION, idempotency_key="job-1")
    assert other.workflow_id != first.workflow_id
    assert len(_runtime(service).submitted) == 2
    assert _count(service, "conductor_workflows_submitted_total", variant="conductor-ultra") == 2
    # a replay reads the workflow's status now
    _runtime(service).finish(first.workflow_id, answer="42")
    replay = await service.start_workflow(caller, QUESTION, idempotency_key="job-1")
    assert replay.status == "completed"


# -- direct calls -------------------------------------------------------------------------------


async def test_a_direct_call_counts_its_spend_and_outcome_and_hides_addresses(
    service: WorkflowService, engine: Engine
) -> None:
    caller = _keyed(engine)
    call, _ = await service.call_worker(caller, "alpha", [])
    result = await call()
    assert result.worker == "alpha"
    assert result.cost_usd > 0
    with engine.connect() as conn:
        spent = conn.execute(select(func.sum(direct_call_table.c.cost_usd))).scalar_one()
    assert spent == pytest.approx(result.cost_usd)
    failing, _ = await service.call_worker(caller, "down", [])
    with pytest.raises(ApiError) as failed:
        await failing()
    assert failed.value.status == 502
    assert failed.value.code == "worker_failed"
    assert "10.20.30.40" not in failed.value.message
    assert failed.value.message.startswith("down")
    calls = "conductor_passthrough_calls_total"
    assert _count(service, calls, worker="alpha", outcome="ok") == 1
    assert _count(service, calls, worker="down", outcome="failed") == 1


# -- running workflows --------------------------------------------------------------------------


async def test_cancel_ends_a_running_workflow_of_the_tenant_only(service: WorkflowService) -> None:
    caller = Caller(tenant="acme")
    started = await service.start_workflow(caller, QUESTION)
    with pytest.raises(LookupError):
        await service.cancel(started.workflow_id, "globex", "not theirs")
    await service.cancel(started.workflow_id, "acme", "changed my mind")
    view = await service.read(started.workflow_id, "acme")
    assert view is not None
    assert view.status == "cancelled"
    # an ended workflow is left as it is
    await service.cancel(started.workflow_id, "acme", "again")
    assert _runtime(service).cancelled == [(started.workflow_id, "changed my mind")]


async def test_following_a_workflow_ends_with_its_outcome(service: WorkflowService) -> None:
    caller = Caller(tenant="acme")
    started = await service.start_workflow(caller, QUESTION)
    with pytest.raises(LookupError):
        async for _ in service.follow(started.workflow_id, "globex"):
            pass
    _runtime(service).finish(started.workflow_id, answer="42")
    kinds = [event.kind async for event in service.follow(started.workflow_id, "acme")]
    assert kinds == ["completed"]
    await service.wait_for_outcome(started.workflow_id, "acme")
    page, more = await service.list_page("acme", _no_filter(), limit=10, after=None)
    assert [s.id for s in page] == [started.workflow_id]
    assert not more
    with pytest.raises(InvalidRequest):
        await service.list_page("acme", _no_filter(), limit=10, after=uuid.uuid4())


def _no_filter() -> WorkflowFilter:
    return WorkflowFilter()


# -- the doors translate, and admit alike -------------------------------------------------------


@pytest.fixture
async def answering(engine: Engine) -> AsyncIterator[WorkflowService]:
    """A service whose workflows answer as soon as they are submitted."""
    service = _service(engine, answers=True)
    yield service
    await service.aclose()


def _http(service: WorkflowService) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(service))
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


async def test_every_http_door_admits_through_the_service(
    answering: WorkflowService, engine: Engine
) -> None:
    secret = create_key(engine, "acme", limits=KeyLimits(rpm_limit=4)).secret
    auth = {"Authorization": f"Bearer {secret}"}
    job = {"question": QUESTION}
    async with _http(answering) as http:
        answers = [
            await http.post("/v1/chat/completions", json=CHAT, headers=auth),
            await http.post("/v1/responses", json=RESPONSE, headers=auth),
            await http.post("/v1/completions", json=COMPLETION, headers=auth),
            await http.post("/v1/workflows", json=job, headers=auth),
        ]
        refused = await http.post("/v1/workflows", json=job, headers=auth)
    assert [a.status_code for a in answers] == [200, 200, 200, 202], [a.text for a in answers]
    remaining = [a.headers["x-ratelimit-remaining-requests"] for a in answers]
    assert remaining == ["3", "2", "1", "0"]
    assert refused.status_code == 429
    assert "retry-after" in refused.headers
    assert len(_runtime(answering).submitted) == 4
    ended = "conductor_api_workflows_total"
    assert _count(answering, ended, variant="conductor-ultra", outcome="completed") == 3


async def test_completions_are_the_chat_path_written_as_text_completions(
    answering: WorkflowService, engine: Engine
) -> None:
    secret = create_key(engine, "acme").secret
    auth = {"Authorization": f"Bearer {secret}"}
    body = {"model": "conductor-ultra", "prompt": QUESTION}
    async with _http(answering) as http:
        whole = await http.post("/v1/completions", json=body, headers=auth)
        streamed = await http.post("/v1/completions", json={**body, "stream": True}, headers=auth)
        unknown = await http.post("/v1/completions", json={**body, "model": "x"}, headers=auth)
        empty = await http.post("/v1/completions", json={**body, "prompt": " "}, headers=auth)
    completion = whole.json()
    assert completion["object"] == "text_completion"
    workflow_id = uuid.UUID(completion["conductor"]["workflow_id"])
    assert completion["id"] == f"cmpl-{workflow_id.hex}"
    assert completion["choices"][0]["text"] == f"answer to {QUESTION}"
    assert completion["choices"][0]["finish_reason"] == "stop"
    chunks = [line for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert all('"object":"text_completion"' in c.replace(" ", "") for c in chunks)
    assert f"answer to {QUESTION}" in streamed.text
    assert streamed.text.endswith("[DONE]\n\n")
    assert unknown.status_code == 404
    assert empty.status_code == 400
    assert empty.json()["error"]["param"] == "prompt"


async def test_grpc_submit_admits_and_counts_as_http_does(
    service: WorkflowService, engine: Engine
) -> None:
    secret = create_key(engine, "acme", limits=KeyLimits(rpm_limit=1)).secret
    servicer = WorkflowsServicer(service)
    bad = GrpcContext(secret)
    with pytest.raises(Aborted):
        await servicer.Submit(workflows_pb2.SubmitRequest(question=QUESTION, max_steps=9), bad)
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
    first = GrpcContext(secret)
    reply = await servicer.Submit(workflows_pb2.SubmitRequest(question=QUESTION), first)
    assert uuid.UUID(reply.workflow_id)
    assert dict(first.initial)["x-ratelimit-remaining-requests"] == "0"
    second = GrpcContext(secret)
    with pytest.raises(Aborted, match="requests per minute"):
        await servicer.Submit(workflows_pb2.SubmitRequest(question=QUESTION), second)
    assert second.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry-after" in dict(second.trailing)
    assert _count(service, "conductor_workflows_submitted_total", variant="conductor-ultra") == 1
    refusals = "conductor_api_key_limit_refusals_total"
    assert _count(service, refusals, reason="rate_limit_exceeded") == 1


# -- limits on tokens, spend and retries --------------------------------------------------------


async def test_tokens_per_minute_count_the_workflows_that_ended(
    service: WorkflowService, engine: Engine
) -> None:
    caller = _keyed(engine, KeyLimits(tpm_limit=50))
    first = await service.start_workflow(caller, QUESTION)
    assert first.limit_headers["x-ratelimit-remaining-tokens"] == "50"
    _runtime(service).finish(first.workflow_id, answer="42", tokens=(100, 20))
    with pytest.raises(ApiError) as refused:
        await service.start_workflow(caller, QUESTION)
    assert refused.value.code == "tokens_limit_exceeded"
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"
    assert 1 <= int(refused.value.headers["Retry-After"]) <= 60


async def test_workers_called_directly_count_against_tokens_per_minute_and_the_budget(
    service: WorkflowService, engine: Engine
) -> None:
    messages = [ChatMessage(role="user", content="one two three four")]
    budgeted = _keyed(engine, KeyLimits(budget_usd=0.000001, budget_period="day"))
    metered = _keyed(engine, KeyLimits(tpm_limit=4))
    for caller, code in ((budgeted, "budget_exceeded"), (metered, "tokens_limit_exceeded")):
        call, _ = await service.call_worker(caller, "alpha", messages)
        await call()
        with pytest.raises(ApiError) as refused:
            await service.call_worker(caller, "alpha", messages)
        assert refused.value.code == code


async def test_concurrent_submissions_with_one_idempotency_key_make_one_workflow(
    service: WorkflowService,
) -> None:
    caller = Caller(tenant="acme")
    started = await asyncio.gather(
        *(service.start_workflow(caller, QUESTION, idempotency_key="race") for _ in range(8))
    )
    assert len({s.workflow_id for s in started}) == 1
    assert len(_runtime(service).submitted) == 1
    assert sum(not s.replayed for s in started) == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"conductor": {"pool": ["nope"]}}, "conductor.pool"),
        ({"messages": [{"role": "user", "content": " "}]}, "messages"),
        ({"model": "conductor-nope"}, "model"),
        ({"conductor": {"max_steps": 9}}, "conductor.max_steps"),
    ],
    ids=["pool", "empty-question", "unknown-model", "max-steps"],
)
async def test_a_chat_refusal_names_the_field_at_fault(
    service: WorkflowService, engine: Engine, body: dict[str, Any], param: str
) -> None:
    secret = create_key(engine, "acme", limits=KeyLimits(rpm_limit=1)).secret
    async with _http(service) as http:
        reply = await http.post(
            "/v1/chat/completions",
            json={**CHAT, **body},
            headers={"Authorization": f"Bearer {secret}"},
        )
    assert reply.status_code in (400, 404), reply.text
    assert reply.json()["error"]["param"] == param
    assert "x-ratelimit-remaining-requests" not in reply.headers  # not counted
    assert _runtime(service).submitted == []


@pytest.mark.parametrize(
    "fields",
    [
        {"max_steps": 9},
        {"max_steps": 0},
        {"max_steps": -3},
        {"metadata": {f"label-{n}": "x" * 600 for n in range(40)}},
        {"metadata": {"k": "x" * 600}},
        {"cost_weight": -1.0},
        {"pool": ["nope"]},
    ],
    ids=[
        "max-steps-9",
        "max-steps-0",
        "max-steps-negative",
        "40-labels",
        "long-label",
        "cost",
        "pool",
    ],
)
async def test_grpc_refuses_what_http_refuses(
    service: WorkflowService, engine: Engine, fields: dict[str, Any]
) -> None:
    secret = create_key(engine, "acme").secret
    context = GrpcContext(secret)
    request = workflows_pb2.SubmitRequest(question=QUESTION, **fields)
    with pytest.raises(Aborted):
        await WorkflowsServicer(service).Submit(request, context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    async with _http(service) as http:
        reply = await http.post(
            "/v1/workflows",
            json={"question": QUESTION, **fields},
            headers={"Authorization": f"Bearer {secret}"},
        )
    assert reply.status_code == 400, reply.text
    assert _runtime(service).submitted == []


def test_an_idempotency_keys_hash_is_the_job_bodys_as_it_was_stored_before() -> None:
    # Keys stored before the service hashed the request keep replaying: the same digest
    body = WorkflowSubmission(question=QUESTION, pool=["alpha"], metadata={"ticket": "7"})
    # stream_answer came later, and is how the answer is delivered, not what is asked: unhashed
    before = body.model_dump(mode="json", exclude={"stream_answer"})
    stored = json.dumps(before, sort_keys=True).encode()
    asked = request_hash(QUESTION, None, ["alpha"], None, None, {"ticket": "7"}, None, None)
    assert asked == hashlib.sha256(stored).hexdigest()
