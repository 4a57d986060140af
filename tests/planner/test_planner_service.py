"""The ``conductor.v1.Planner`` gRPC service, its wire conversions and its client.

Servers run in-process on free ports with scripted backends; one test runs the real
``conductor planner`` process against the fake OpenAI server, one the real SmolLM2 model.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import (  # type: ignore[import-untyped]
    reflection_pb2,
    reflection_pb2_grpc,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.chat import Usage
from conductor.errors import (
    ConductorError,
    ConfigurationError,
    InvalidRequest,
    PlannerRejected,
    PlannerTimeout,
    PlannerUnavailable,
    ProviderUnavailable,
)
from conductor.ports import PlanRequest, PriorRound
from conductor.workflow import ALL, Plan, PlanOutcome, PlanStep, PoolEntry
from conductor_adapters.rpc.planner_client import PLANNER_SERVICE, GrpcPlanner
from conductor_adapters.rpc.planner_wire import (
    outcome_from_proto,
    outcome_to_proto,
    request_from_proto,
    request_to_proto,
)
from conductor_adapters.rpc.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from conductor_adapters.settings import Settings
from conductor_cli.local_stack import free_port
from conductor_planner.server import serve, start_planner_server

from fakes.openai_server import FakeOpenAIServer
from fakes.planner_service import (
    GatedFactory,
    PlannerProcess,
    SlowBackend,
    factory_of,
    health_status,
    running_planner,
)
from fakes.scripted import ScriptedBackend, lists

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
POOL = [
    PoolEntry(name="alpha", description="A careful mathematician."),
    PoolEntry(name="beta", description="A fast coder."),
    PoolEntry(name="conductor", description="", is_conductor=True),
]
GOOD_OUTPUT = lists([0, 1], ["Solve it.", "Check the solution."], [[], ["all"]])


def _request(**fields: Any) -> PlanRequest:
    return PlanRequest(**{"question": "What is 17 * 23?", "pool": POOL, "max_steps": 3, **fields})


# -- wire conversions ------------------------------------------------------------------------

int32s = st.integers(-(2**31), 2**31 - 1)
# Below 2**62: the wire carries total_tokens (prompt + completion) as an int64 too.
tokens = st.integers(0, 2**62 - 1)
texts = st.text(max_size=30)
floats = st.floats(allow_nan=False)
access_entries = st.one_of(st.just(ALL), int32s)
plan_steps = st.builds(
    PlanStep,
    model_id=int32s,
    subtask=texts,
    access_list=st.lists(access_entries, max_size=4).map(tuple),
)
plans = st.builds(Plan, steps=st.lists(plan_steps, max_size=5).map(tuple))
pools = st.lists(st.builds(PoolEntry, name=texts, description=texts, is_conductor=st.booleans()))
usages = st.builds(
    Usage,
    prompt_tokens=tokens,
    completion_tokens=tokens,
    cached_tokens=tokens,
    reasoning_tokens=tokens,
)
priors = st.builds(
    PriorRound,
    plan=plans,
    answers=st.lists(st.one_of(st.none(), texts), max_size=5),
    last_answer=texts,
)
requests = st.builds(
    PlanRequest,
    question=texts,
    pool=pools,
    max_steps=int32s,
    # None and 0 both mean "max_steps" (0 is the wire's unset), so 0 is not drawn.
    workflow_max_steps=st.one_of(st.none(), int32s.filter(bool)),
    round=int32s,
    prior=st.one_of(st.none(), priors),
    temperature=floats,
    max_tokens=int32s,
    fallback_model_id=int32s,
)
outcomes = st.builds(
    PlanOutcome,
    round=int32s,
    raw_output=texts,
    valid=st.booleans(),
    errors=st.lists(texts, max_size=3),
    plan=plans,
    stop=st.booleans(),
    pool=pools,
    usage=usages,
    cost_usd=floats,
    latency_ms=floats,
    backend=texts,
)


@settings(deadline=None)
@given(requests)
def test_a_plan_request_survives_the_wire(request: PlanRequest) -> None:
    # when
    wire = planner_pb2.PlanRequest.FromString(request_to_proto(request).SerializeToString())

    # then
    assert request_from_proto(wire) == request


@settings(deadline=None)
@given(outcomes)
def test_a_plan_outcome_survives_the_wire(outcome: PlanOutcome) -> None:
    # when
    wire = common_pb2.PlannerCall.FromString(outcome_to_proto(outcome).SerializeToString())

    # then
    assert outcome_from_proto(wire) == outcome
    assert wire.usage.total_tokens == outcome.usage.total_tokens


def test_missing_answers_travel_as_unanswered_indices() -> None:
    # given
    plan = Plan(steps=(PlanStep(model_id=0, subtask="a"), PlanStep(model_id=1, subtask="b")))
    request = _request(round=1, prior=PriorRound(plan=plan, answers=[None, ""], last_answer=""))

    # when
    wire = request_to_proto(request)

    # then: "" is an empty answer, None a missing one
    assert list(wire.prior.answers) == ["", ""]
    assert list(wire.prior.unanswered) == [0]


def test_unset_optional_fields_take_the_model_defaults() -> None:
    # given
    wire = planner_pb2.PlanRequest(question="q", pool=[common_pb2.PoolEntry(name="a")])

    # when
    request = request_from_proto(wire)

    # then
    defaults = PlanRequest(question="q", pool=[], max_steps=1)
    assert (request.temperature, request.max_tokens) == (defaults.temperature, defaults.max_tokens)
    assert request.prior is None


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (
            planner_pb2.PriorRound(answers=["x"], unanswered=[3]),
            "prior.unanswered has index 3",
        ),
        (
            planner_pb2.PriorRound(
                plan=common_pb2.Plan(steps=[common_pb2.PlanStep(access_list=[{}])])
            ),
            "access-list entry",
        ),
    ],
)
def test_messages_the_models_cannot_hold_are_invalid_requests(wire: Any, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        request_from_proto(planner_pb2.PlanRequest(question="q", round=1, prior=wire))


# -- the service, in-process -----------------------------------------------------------------


async def test_health_is_not_serving_until_the_backend_has_loaded() -> None:
    # given: a backend whose loading blocks until released
    backend = ScriptedBackend([GOOD_OUTPUT])
    factory = GatedFactory(backend)
    async with running_planner(factory) as (server, channel):
        await asyncio.to_thread(factory.started.wait, 10)

        # when: loading
        statuses = [await health_status(channel, name) for name in ("", PLANNER_SERVICE)]
        with pytest.raises(grpc.aio.AioRpcError) as loading:
            await planner_pb2_grpc.PlannerStub(channel).Plan(request_to_proto(_request()))

        # then
        assert statuses == [NOT_SERVING, NOT_SERVING]
        assert loading.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "loading" in (loading.value.details() or "")

        # when: loaded
        factory.release()
        await server.wait_loaded()

        # then
        assert await health_status(channel, "") == SERVING
        assert await health_status(channel, PLANNER_SERVICE) == SERVING


async def test_plan_returns_the_parsed_plan_with_usage_backend_and_pool() -> None:
    # given
    backend = ScriptedBackend([GOOD_OUTPUT])
    async with running_planner(factory_of(backend)) as (server, _):
        await server.wait_loaded()
        client = GrpcPlanner(server.address)

        # when
        outcome = await client.plan(_request())
        await client.aclose()

    # then
    assert outcome.valid, outcome.errors
    assert outcome.raw_output == GOOD_OUTPUT
    assert outcome.plan.model_ids == [0, 1]
    assert outcome.plan.access_lists == [[], [ALL]]
    assert outcome.usage == Usage(prompt_tokens=100, completion_tokens=20)
    assert outcome.backend == "scripted"
    assert outcome.pool == POOL
    assert outcome.latency_ms >= 0
    assert len(backend.requests) == 1


async def test_invalid_model_output_is_a_fallback_plan_not_an_error() -> None:
    # given
    backend = ScriptedBackend(["I would rather chat about the weather."])
    async with running_planner(factory_of(backend)) as (server, _):
        await server.wait_loaded()
        client = GrpcPlanner(server.address)

        # when
        outcome = await client.plan(_request(fallback_model_id=1))
        await client.aclose()

    # then
    assert not outcome.valid
    assert outcome.errors
    assert outcome.plan.model_ids == [1]
    assert outcome.raw_output == "I would rather chat about the weather."


async def test_reflection_lists_the_planner_health_and_reflection_services() -> None:
    async with running_planner(factory_of(ScriptedBackend([GOOD_OUTPUT]))) as (_, channel):
        # when
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(timeout=5)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        await call.done_writing()
        reply = await call.read()

    # then
    names = {service.name for service in reply.list_services_response.service}
    assert names == {
        "conductor.v1.Planner",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"question": "  "}, "question is empty"),
        ({"pool": []}, "pool is empty"),
        ({"pool": POOL[2:]}, "pool has no worker"),
        ({"max_steps": 0}, "max_steps must be 1 to 5, got 0"),
        ({"max_steps": 6}, "max_steps must be 1 to 5, got 6"),
        ({"fallback_model_id": 2}, "fallback_model_id 2 is not a worker"),
        ({"fallback_model_id": 7}, "fallback_model_id 7 is not a worker"),
        ({"round": -1}, "round must be >= 0"),
        (
            {"max_steps": 3, "workflow_max_steps": 2},
            "workflow_max_steps must be max_steps (3) to 5, got 2",
        ),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"temperature": -0.5}, "temperature must be 0 to 2"),
        (
            {
                "round": 1,
                "prior": PriorRound(
                    plan=Plan(steps=(PlanStep(model_id=0, subtask="a"),)),
                    answers=[],
                    last_answer="",
                ),
            },
            "prior has 1 steps but 0 answers",
        ),
    ],
)
async def test_bad_requests_are_invalid_argument_with_a_reason(
    fields: dict[str, Any], message: str
) -> None:
    # given
    backend = ScriptedBackend([GOOD_OUTPUT])
    async with running_planner(factory_of(backend)) as (server, _):
        await server.wait_loaded()
        client = GrpcPlanner(server.address)

        # when
        with pytest.raises(PlannerRejected) as rejected:
            await client.plan(_request(**fields))
        await client.aclose()

    # then: the reason and the planner's address, and the model was never called
    assert message in str(rejected.value)
    assert server.address in str(rejected.value)
    assert backend.requests == []


async def test_a_malformed_message_is_invalid_argument() -> None:
    # given: an access entry with neither "all" nor a step
    wire = request_to_proto(_request(round=1))
    wire.prior.plan.steps.add(model_id=0, subtask="a", access_list=[common_pb2.AccessEntry()])
    wire.prior.answers.append("x")
    async with running_planner(factory_of(ScriptedBackend([GOOD_OUTPUT]))) as (server, channel):
        await server.wait_loaded()

        # when
        with pytest.raises(grpc.aio.AioRpcError) as rejected:
            await planner_pb2_grpc.PlannerStub(channel).Plan(wire, timeout=5)

    # then
    assert rejected.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "access-list entry" in (rejected.value.details() or "")


async def test_concurrent_plans_run_at_the_same_time() -> None:
    # given: a backend that takes 0.3 s per plan
    backend = SlowBackend([GOOD_OUTPUT], delay_s=0.3)
    async with running_planner(factory_of(backend)) as (server, _):
        await server.wait_loaded()
        client = GrpcPlanner(server.address)
        await client.plan(_request())  # connect first: time only the calls

        # when
        started = time.perf_counter()
        results = await asyncio.gather(*(client.plan(_request()) for _ in range(5)))
        elapsed = time.perf_counter() - started
        await client.aclose()

    # then: about one call's time, far from five
    assert all(outcome.valid for outcome in results)
    assert elapsed < 0.9, f"5 calls of 0.3 s took {elapsed:.2f} s"


async def test_one_client_spreads_its_calls_over_every_planner_its_name_resolves_to() -> None:
    # given: two planners, and one client whose target resolves to both (as a headless
    # Service's name resolves to every ready planner pod)
    first, second = ScriptedBackend([GOOD_OUTPUT] * 8), ScriptedBackend([GOOD_OUTPUT] * 8)
    async with (
        running_planner(factory_of(first)) as (one, _),
        running_planner(factory_of(second)) as (two, _),
    ):
        await one.wait_loaded()
        await two.wait_loaded()
        port_one, port_two = one.address.rsplit(":", 1)[1], two.address.rsplit(":", 1)[1]
        client = GrpcPlanner(f"ipv4:127.0.0.1:{port_one},127.0.0.1:{port_two}")

        # when: it plans eight times, one call after another
        outcomes = [await client.plan(_request()) for _ in range(8)]
        await client.aclose()

    # then: both planners took calls (one connection would have sent all eight to one)
    assert all(outcome.valid for outcome in outcomes)
    assert len(first.requests) >= 2, (len(first.requests), len(second.requests))
    assert len(second.requests) >= 2, (len(first.requests), len(second.requests))
    assert len(first.requests) + len(second.requests) == 8


async def test_a_failing_backend_is_unavailable_to_the_client() -> None:
    # given: the openai backend's endpoint refuses connections
    class DownBackend(ScriptedBackend):
        async def generate(self, *args: Any, **kwargs: Any) -> Any:
            raise ProviderUnavailable("connection refused")

    async with running_planner(factory_of(DownBackend([]))) as (server, _):
        await server.wait_loaded()
        client = GrpcPlanner(server.address)

        # when
        with pytest.raises(PlannerUnavailable, match="planner backend failed") as failed:
            await client.plan(_request())
        await client.aclose()

    # then
    assert failed.value.retryable


async def test_the_client_deadline_is_a_timeout_error() -> None:
    backend = SlowBackend([GOOD_OUTPUT], delay_s=5.0)
    async with running_planner(factory_of(backend)) as (server, _):
        await server.wait_loaded()
        client = GrpcPlanner(server.address, timeout_s=0.3)

        # when
        started = time.perf_counter()
        with pytest.raises(PlannerTimeout, match=r"did not answer within 0\.3 s") as late:
            await client.plan(_request())
        await client.aclose()

    # then
    assert time.perf_counter() - started < 2
    assert server.address in str(late.value)
    assert late.value.retryable


async def test_a_client_with_nothing_listening_fails_fast_and_typed() -> None:
    # given: a port nobody listens on
    address = f"127.0.0.1:{free_port()}"
    client = GrpcPlanner(address, timeout_s=10)

    # when
    started = time.perf_counter()
    with pytest.raises(PlannerUnavailable) as failed:
        await client.plan(_request())
    ready = await client.serving(timeout_s=1)
    await client.aclose()

    # then
    assert time.perf_counter() - started < 10
    assert f"planner at {address} is unavailable" in str(failed.value)
    assert failed.value.retryable
    assert not ready


async def test_a_backend_that_fails_to_load_stops_serve_with_a_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(_settings: Settings) -> Any:
        raise ConfigurationError("GGUF model file not found: /nowhere.gguf")

    # when
    code = await serve(Settings(), "127.0.0.1", 0, backend_factory=broken, grace_s=0)

    # then
    assert code == 1
    err = capsys.readouterr().err
    assert "failed to load: GGUF model file not found: /nowhere.gguf" in err


async def test_a_busy_port_is_a_clear_error() -> None:
    async with running_planner(factory_of(ScriptedBackend([GOOD_OUTPUT]))) as (server, _):
        with pytest.raises(ConductorError, match=f"cannot listen on 127.0.0.1:{server.port}"):
            await start_planner_server(Settings(), "127.0.0.1", server.port)


# -- the real process and the real model -----------------------------------------------------


@pytest.mark.processes
async def test_the_planner_process_serves_then_drains_on_sigterm(
    fake_openai: FakeOpenAIServer,
) -> None:
    # given: `conductor planner` on the openai backend, pointed at the fake server
    fake_openai.responder = lambda _messages: GOOD_OUTPUT
    metrics_url = f"http://127.0.0.1:{free_port()}"
    env = {
        "CONDUCTOR_PLANNER_BACKEND": "openai",
        "CONDUCTOR_PLANNER_BASE_URL": fake_openai.base_url,
        "CONDUCTOR_PLANNER_MODEL": "conductor-fake",
        "CONDUCTOR_METRICS_PORT": metrics_url.rpartition(":")[2],
    }
    process = await PlannerProcess(env, "--grace", "5").start()
    try:
        client = GrpcPlanner(process.address, timeout_s=10)
        assert await client.serving()
        async with grpc.aio.insecure_channel(process.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=PLANNER_SERVICE))
            assert (await watch.read()).status == SERVING

            # when
            outcome = await client.plan(_request())
            async with httpx.AsyncClient(base_url=metrics_url) as http:
                ready = (await http.get("/readyz")).status_code
                metrics = (await http.get("/metrics")).text
            process.terminate()
            signalled = time.perf_counter()
            after_signal = await asyncio.wait_for(watch.read(), 5)
            watch.cancel()
        await client.aclose()
        code = await process.wait(10)

        # then
        assert outcome.valid, outcome.errors
        assert outcome.backend == "openai"
        assert outcome.plan.model_ids == [0, 1]
        assert fake_openai.last_request.json["model"] == "conductor-fake"
        # and its metrics port said it was ready and counted the plan
        assert ready == 200
        assert 'conductor_planner_plans_total{backend="openai",valid="true"} 1.0' in metrics
        assert 'conductor_planner_tokens_total{backend="openai",kind="prompt"}' in metrics
        duration = 'gen_ai_server_request_duration_seconds_count{backend="openai",outcome="ok"}'
        assert f"{duration} 1.0" in metrics
        assert after_signal.status == NOT_SERVING
        assert code == 0, process.log()
        assert time.perf_counter() - signalled < 5
    finally:
        await process.stop()
    assert process.process is not None
    assert process.process.returncode == 0
    assert any("stopping: NOT_SERVING" in line for line in process.lines)


@pytest.mark.model
async def test_the_real_model_plans_over_grpc() -> None:
    # given: the default backend, llama.cpp with the SmolLM2 weights
    llamacpp = Settings(planner_backend="llamacpp")
    async with running_planner(None, settings=llamacpp) as (server, _):
        backend = await server.wait_loaded()
        client = GrpcPlanner(server.address, timeout_s=120)

        # when
        outcome = await client.plan(_request(temperature=0.7))
        await client.aclose()

    # then
    assert backend.name == "llamacpp"
    # Under the schema the only error an untrained model can make is copying an example's
    # subtask (rare on arithmetic), which falls back to one step.
    assert all("copied from the prompt's examples" in e for e in outcome.errors), outcome.errors
    assert outcome.valid is (not outcome.errors)
    assert 1 <= len(outcome.plan.steps) <= 3
    assert outcome.usage.prompt_tokens > 500
    assert outcome.backend == "llamacpp"
