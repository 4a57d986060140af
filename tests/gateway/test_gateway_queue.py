"""The gateway as deployed: real ``conductor gateway`` processes on RabbitMQ, quotas and replies
in Redis, a fake provider on loopback whose own request log is the evidence."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from conductor.chat import ChatMessage
from conductor.errors import StepCallFailed
from conductor.messaging import CallReply, CallRequest, StepContext, ended_channel
from conductor.pool import Pool, load_pool_file
from conductor_adapters.queue import new_celery_app
from conductor_cli.local_stack import ServiceProcess, free_port
from conductor_gateway.celery_app import GatewayProcess
from conductor_gateway.client import QueuedStepRunner
from conductor_gateway.registry import build_workers
from conductor_gateway.settings import GatewaySettings

from fakes.brokers import private_redis_server
from fakes.gateway_process import start_gateway, write_pool_file
from fakes.metrics import samples
from fakes.openai_server import (
    FakeOpenAIServer,
    completion,
    count_tokens,
    error,
    openai_compatible_spec,
)

pytestmark = [pytest.mark.broker, pytest.mark.processes]

QUEUE = "gateway.openai-compatible"
WINDOW_S = 2.0
RPM, TPM, CONCURRENCY = 5, 400, 2


@pytest.fixture
def fake_provider() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(latency_s=0.3) as server:
        yield server


@pytest.fixture
def env(
    tmp_path: Path,
    fake_provider: FakeOpenAIServer,
    amqp_url: str,
    redis_url: str,
    redis_prefix: str,
) -> dict[str, str]:
    pool_file = write_pool_file(
        tmp_path / "pool.yaml",
        {
            "limited": {
                "provider": "openai-compatible",
                "model": "fake-model",
                "base_url": fake_provider.base_url,
                "max_tokens": 16,
                "quotas": {"rpm": RPM, "tpm": TPM, "max_concurrency": CONCURRENCY},
            },
            "open": {
                "provider": "openai-compatible",
                "model": "fake-model",
                "base_url": fake_provider.base_url,
            },
        },
    )
    return {
        "CONDUCTOR_BROKER_URL": amqp_url,
        "CONDUCTOR_REDIS_URL": redis_url,
        "CONDUCTOR_REDIS_PREFIX": redis_prefix,
        "CONDUCTOR_POOL_FILE": str(pool_file),
        "CONDUCTOR_QUOTA_WINDOW_S": str(WINDOW_S),
        "CONDUCTOR_QUOTA_SKEW_S": "0.1",
        "CONDUCTOR_QUOTA_LEASE_S": "5",
        "CONDUCTOR_RETRY_BASE_DELAY_S": "0.05",
    }


@pytest.fixture
def gateways(env: dict[str, str], tmp_path: Path) -> Iterator[list[ServiceProcess]]:
    started: list[ServiceProcess] = []

    def start(count: int = 1) -> list[ServiceProcess]:
        for _ in range(count):
            log = tmp_path / f"gateway-{len(started)}.log"
            started.append(start_gateway(env, log, queues=QUEUE, concurrency=20))
        return started

    yield start  # type: ignore[misc]
    for process in started:
        process.stop()


@pytest.fixture
async def runner(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[QueuedStepRunner]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = GatewaySettings.load()
    app = new_celery_app("conductor_test_client", settings)
    client = aioredis.from_url(settings.redis_url)
    pool = load_pool_file(Path(env["CONDUCTOR_POOL_FILE"]))
    step_runner = QueuedStepRunner(
        app, pool, client, prefix=settings.redis_prefix, reply_timeout_s=120
    )
    yield step_runner
    # Bounded: a close that hangs fails here, naming itself, not at the suite's timeout.
    async with asyncio.timeout(30):
        await step_runner.aclose()
        await client.aclose()
    app.close()


def _question(n: int) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=f"Question number {n}: what is {n} + {n}?")]


async def test_a_call_through_the_queue_returns_the_answer_and_its_attempts(
    gateways: Any,
    runner: QueuedStepRunner,
    fake_provider: FakeOpenAIServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateways(1)

    result = await runner.call("open", _question(1))

    assert result.text == "echo: Question number 1: what is 1 + 1?"
    assert result.worker == "open"
    assert [(a.number, a.status, a.worker) for a in result.attempts] == [(1, "ok", "open")]
    assert len(fake_provider.chat_requests) == 1
    # And closed, its reply reader stops after its current read: it is not left behind
    # (a cancelled read used to hang the close for its whole 5 s bound)
    await runner.aclose()
    assert "did not stop" not in caplog.text


async def test_a_worker_the_gateway_does_not_know_is_a_failure_reply_not_a_hang(
    gateways: Any, runner: QueuedStepRunner, tmp_path: Path
) -> None:
    # Given a caller whose pool has a worker the gateways' pool file does not
    gateways(1)
    extra = write_pool_file(
        tmp_path / "caller.yaml",
        {"ghost": {"provider": "openai-compatible", "model": "m", "base_url": "http://x"}},
    )
    runner.pool = load_pool_file(extra)

    with pytest.raises(StepCallFailed, match="no worker named 'ghost'"):
        await runner.call("ghost", _question(1))


async def test_quotas_hold_across_three_gateway_processes_and_every_call_completes(
    gateways: Any, runner: QueuedStepRunner, fake_provider: FakeOpenAIServer
) -> None:
    # Given three gateway processes sharing one Redis, and a worker limited to RPM requests,
    # TPM tokens per window and CONCURRENCY calls in flight
    gateways(3)
    calls = 14

    # When more calls arrive at once than one window admits
    results = await asyncio.gather(*[runner.call("limited", _question(n)) for n in range(calls)])

    # Then every call completes...
    assert len(results) == calls
    assert all(r.text.startswith("echo: ") for r in results)
    # ...and the provider's own log never shows a window over any limit
    log = fake_provider.chat_requests
    assert len(log) == calls
    times = sorted(r.received_at for r in log)
    per_window = [sum(1 for u in times if t <= u < t + WINDOW_S) for t in times]
    assert max(per_window) <= RPM, per_window
    assert max(r.in_flight for r in log) <= CONCURRENCY
    spent = sorted((r.received_at, _tokens_spent(r.json)) for r in log)
    tokens_per_window = [sum(n for u, n in spent if t <= u < t + WINDOW_S) for t, _ in spent]
    assert max(tokens_per_window) <= TPM, tokens_per_window
    # and the limit was really binding: the calls were spread over several windows
    assert times[-1] - times[0] >= WINDOW_S * (math.ceil(calls / RPM) - 1)


def _tokens_spent(body: dict[str, Any]) -> int:
    """What the fake charged for this request: its prompt plus its echoed answer."""
    messages = body["messages"]
    prompt = sum(count_tokens(m["content"]) + 4 for m in messages)
    return prompt + count_tokens("echo: " + messages[-1]["content"])


async def test_a_gateway_killed_mid_call_loses_no_step(
    gateways: Any, runner: QueuedStepRunner, fake_provider: FakeOpenAIServer
) -> None:
    # Given one gateway, and a provider slow enough to kill the gateway mid-call
    fake_provider.latency_s = 3.0
    (first,) = gateways(1)
    call = asyncio.create_task(runner.call("open", _question(7)))
    await _until(lambda: len(fake_provider.chat_requests) == 1, timeout_s=30)

    # When the gateway is SIGKILLed while the provider is still answering, and another starts
    first.kill()
    gateways(1)

    # Then the call is redelivered to the new gateway and completes
    result = await asyncio.wait_for(call, 60)
    assert result.text == "echo: Question number 7: what is 7 + 7?"
    assert len(fake_provider.chat_requests) == 2
    assert fake_provider.chat_requests[0].json == fake_provider.chat_requests[1].json


async def test_no_gateway_on_the_queue_is_a_timeout_that_names_the_queue(
    runner: QueuedStepRunner,
) -> None:
    runner.reply_timeout_s = 1.0
    with pytest.raises(StepCallFailed, match=QUEUE):
        await runner.call("open", _question(uuid.uuid4().int % 100))


async def _until(condition: Any, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def _gateway_process(provider: FakeOpenAIServer, redis_url: str, prefix: str) -> GatewayProcess:
    """A gateway process's machinery in this one: worker ``primary`` on ``provider``, replies
    on ``redis_url`` (which is also the broker it would consume)."""
    pool = Pool(workers=(openai_compatible_spec("primary", provider.base_url),))
    settings = GatewaySettings(broker_url=redis_url, redis_url=redis_url, redis_prefix=prefix)
    return GatewayProcess(settings, pool, build_workers(pool))


def test_an_answer_received_while_redis_restarts_is_delivered_not_paid_again(
    fake_provider: FakeOpenAIServer,
) -> None:
    # Given a gateway process whose replies go to a Redis of the test's own, and a provider
    # that answers in one second
    port = free_port()
    servers = [private_redis_server(port)]
    url = f"redis://127.0.0.1:{port}/0"
    process = _gateway_process(fake_provider, url, "reply-kept:")
    fake_provider.enqueue(completion("4", delay_s=1.0))
    request = CallRequest(
        call_id="kept-1",
        worker="primary",
        messages=[ChatMessage(role="user", content="What is 2 + 2?")],
        reply_to="reply-kept:reply:kept-1",
    )
    handled: list[CallReply] = []
    handler = threading.Thread(
        target=lambda: handled.append(process.handle(request, app=None)),  # type: ignore[arg-type]
    )
    try:
        # When Redis dies while the provider answers, and comes back empty 3 s later
        handler.start()
        time.sleep(0.3)
        servers[-1].kill()
        servers[-1].wait()
        time.sleep(3.0)
        servers.append(private_redis_server(port))
        handler.join(timeout=30)
        with redis.Redis.from_url(url) as client:
            reply = client.blpop(["reply-kept:reply:kept-1"], timeout=5)
    finally:
        process.close()
        for server in servers:
            server.kill()
            server.wait()

    # Then the answer reached the reply list, from the one provider call
    assert handled, "the call did not return within 30 s"
    assert reply is not None, "no reply was pushed after Redis came back"
    delivered = CallReply.model_validate_json(reply[1])
    assert delivered.ok
    assert delivered.result is not None
    assert delivered.result.text == "4"
    assert len(fake_provider.chat_requests) == 1


def test_a_call_past_its_callers_deadline_is_never_sent_to_the_provider(
    fake_provider: FakeOpenAIServer, redis_url: str, redis_prefix: str
) -> None:
    # Given a call that waited in the queue until its caller had stopped waiting
    process = _gateway_process(fake_provider, redis_url, redis_prefix)
    request = CallRequest(
        call_id="expired-1",
        worker="primary",
        messages=[ChatMessage(role="user", content="What is 2 + 2?")],
        reply_to=f"{redis_prefix}replies:expired",
        expires_at=datetime.now(UTC) - timedelta(seconds=1),
    )
    try:
        # When a gateway takes it
        reply = process.handle(request, app=None)  # type: ignore[arg-type]
    finally:
        process.close()

    # Then it answers that the deadline passed, and the provider is not called (nor billed)
    assert not reply.ok
    assert "deadline" in (reply.error or "")
    assert "before a gateway took it" in (reply.error or "")
    assert fake_provider.chat_requests == []


def test_a_call_still_running_at_its_callers_deadline_is_abandoned_then(
    fake_provider: FakeOpenAIServer, redis_url: str, redis_prefix: str
) -> None:
    # Given a provider that takes 5 s, and a caller that waits 1 s
    process = _gateway_process(fake_provider, redis_url, redis_prefix)
    fake_provider.enqueue(completion("4", delay_s=5.0))
    request = CallRequest(
        call_id="abandoned-1",
        worker="primary",
        messages=[ChatMessage(role="user", content="What is 2 + 2?")],
        reply_to=f"{redis_prefix}replies:abandoned",
        expires_at=datetime.now(UTC) + timedelta(seconds=1),
    )
    try:
        # When the gateway makes the call
        started = time.monotonic()
        reply = process.handle(request, app=None)  # type: ignore[arg-type]
        took = time.monotonic() - started
    finally:
        process.close()

    # Then it gives up at the deadline (this bounds what a stopping gateway must wait for)
    assert not reply.ok
    assert "before it was answered" in (reply.error or "")
    assert took < 4.0, f"the call held the gateway {took:.1f} s, past its 1 s deadline"


def test_replies_to_an_in_process_caller_leave_in_the_order_they_came(
    fake_provider: FakeOpenAIServer, redis_url: str, redis_prefix: str
) -> None:
    # Given a gateway process answering five calls, one after another, onto one caller's list
    process = _gateway_process(fake_provider, redis_url, redis_prefix)
    reply_to = f"{redis_prefix}replies:ordered"
    try:
        for n in range(5):
            request = CallRequest(
                call_id=f"call-{n}",
                worker="primary",
                messages=[ChatMessage(role="user", content=f"question {n}")],
                reply_to=reply_to,
            )
            process.handle(request, app=None)  # type: ignore[arg-type]
    finally:
        process.close()

    # When the caller reads them as it does (from the left)
    with redis.Redis.from_url(redis_url) as client:
        popped = [client.blpop([reply_to], timeout=5) for _ in range(5)]

    # Then the oldest comes first: under a stream of calls none sinks behind newer ones
    assert all(item is not None for item in popped)
    order = [CallReply.model_validate_json(item[1]).call_id for item in popped if item]
    assert order == [f"call-{n}" for n in range(5)]


async def test_a_gateway_serves_metrics_that_count_calls_held_for_quota_as_in_flight(
    env: dict[str, str], runner: QueuedStepRunner, tmp_path: Path
) -> None:
    # Given a gateway with its metrics port, and a worker that may run 2 calls at once
    port = free_port()
    gateway = start_gateway(
        {**env, "CONDUCTOR_METRICS_PORT": str(port)},
        tmp_path / "gateway.log",
        queues=QUEUE,
        concurrency=20,
    )
    in_flight_key = ("conductor_gateway_calls_in_flight", (("queue", QUEUE),))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            # When 6 calls arrive at once, and the metrics are read while they run
            calls = [asyncio.create_task(runner.call("limited", _question(n))) for n in range(6)]
            peak = 0.0
            while not all(call.done() for call in calls):
                scraped = samples((await http.get("/metrics")).text)
                peak = max(peak, scraped.get(in_flight_key, 0.0))
                await asyncio.sleep(0.05)
            await asyncio.gather(*calls)
            metrics = await http.get("/metrics")
            health, ready = await http.get("/healthz"), await http.get("/readyz")
    finally:
        gateway.stop()

    # Then the calls waiting for quota counted as held by the gateway, not as queued: more
    # than the 2 the worker may run at once were in flight at the peak, none at the end
    final = samples(metrics.text)
    assert peak > CONCURRENCY
    assert final[in_flight_key] == 0
    # And each call is counted once, with its tokens, duration and quota wait
    ok = (("outcome", "ok"), ("queue", QUEUE), ("status", ""), ("worker", "limited"))
    assert final[("conductor_gateway_calls_total", ok)] == 6
    for kind in ("input", "output"):
        labels = (
            ("gen_ai_provider_name", "openai-compatible"),
            ("gen_ai_token_type", kind),
            ("worker", "limited"),
        )
        assert final[("gen_ai_client_token_usage_count", labels)] == 6
        assert final[("gen_ai_client_token_usage_sum", labels)] > 0
    duration = (
        ("gen_ai_provider_name", "openai-compatible"),
        ("gen_ai_request_model", "fake-model"),
        ("outcome", "ok"),
        ("worker", "limited"),
    )
    assert final[("gen_ai_client_operation_duration_seconds_count", duration)] == 6
    assert final[("gen_ai_client_operation_duration_seconds_sum", duration)] >= 6 * 0.3
    wait = (("worker", "limited"),)
    assert final[("conductor_gateway_quota_wait_seconds_count", wait)] == 6
    assert final[("conductor_gateway_quota_wait_seconds_sum", wait)] > 0
    assert (health.status_code, ready.status_code) == (200, 200)


async def test_a_gateway_stopped_by_sigterm_finishes_its_calls_and_leaves_the_rest_queued(
    env: dict[str, str], runner: QueuedStepRunner, fake_provider: FakeOpenAIServer, tmp_path: Path
) -> None:
    # Given a gateway that runs 2 calls at once, 2 s each, and 5 calls sent to it
    fake_provider.latency_s = 2.0
    first = start_gateway(env, tmp_path / "first.log", queues=QUEUE, concurrency=2)
    calls = [asyncio.create_task(runner.call("open", _question(n))) for n in range(5)]
    await _until(lambda: len(fake_provider.chat_requests) == 2, timeout_s=30)

    # When it gets SIGTERM (as Kubernetes stops a pod) with 2 calls in flight
    stopping = time.monotonic()
    await asyncio.to_thread(first.stop, 60)
    stopped_after = time.monotonic() - stopping
    answered_before_restart = sum(call.done() for call in calls)

    # Then it finished both calls before exiting, cleanly, and took no other call with it
    assert first.process is not None
    assert first.process.returncode == 0, first.tail()
    assert answered_before_restart == 2
    assert stopped_after < 30
    # And the 3 calls it had not started wait in the queue for the next gateway, which makes
    # each of them once: 5 calls to the provider in all, none made twice
    second = start_gateway(env, tmp_path / "second.log", queues=QUEUE, concurrency=2)
    try:
        results = await asyncio.wait_for(asyncio.gather(*calls), 60)
    finally:
        second.stop()
    assert sorted(r.text for r in results) == sorted(
        f"echo: Question number {n}: what is {n} + {n}?" for n in range(5)
    )
    assert len(fake_provider.chat_requests) == 5


def test_a_call_cancelled_with_its_workflow_replies_with_the_calls_it_made(
    fake_provider: FakeOpenAIServer, redis_url: str, redis_prefix: str
) -> None:
    """Issue 36 #12: the 429s a call got before its workflow ended go back with the reply
    (the aggregator records them), rather than vanish with the cancelled call."""
    # Given a provider in a storm of 429s, and a call of a workflow retrying through it
    rate_limited = error(429, "Rate limit reached", headers={"Retry-After": "0.2"})
    fake_provider.enqueue(*[rate_limited] * 20)
    pool = Pool(workers=(openai_compatible_spec("primary", fake_provider.base_url),))
    settings = GatewaySettings(
        broker_url=redis_url, redis_url=redis_url, redis_prefix=redis_prefix, retry_max_attempts=20
    )
    process = GatewayProcess(settings, pool, build_workers(pool))
    workflow_id = str(uuid.uuid4())
    request = CallRequest(
        call_id="storm-1",
        worker="primary",
        messages=[ChatMessage(role="user", content="What is 2 + 2?")],
        reply_to=f"{redis_prefix}replies:storm",
        context=StepContext(workflow_id=workflow_id, step=0, dispatch=1),
    )
    handled: list[CallReply] = []
    handler = threading.Thread(
        target=lambda: handled.append(process.handle(request, app=None)),  # type: ignore[arg-type]
    )
    try:
        handler.start()
        deadline = time.monotonic() + 20
        while len(fake_provider.chat_requests) < 3:
            assert time.monotonic() < deadline, "the provider was not called 3 times in 20 s"
            time.sleep(0.02)
        # When the aggregator announces that its workflow ended
        with redis.Redis.from_url(redis_url) as client:
            client.publish(ended_channel(redis_prefix), workflow_id)
        handler.join(timeout=20)
    finally:
        process.close()

    # Then the reply says so and carries one attempt per call the provider received
    assert handled, "the call did not end within 20 s of its workflow"
    [reply] = handled
    assert not reply.ok
    assert "its workflow had ended" in (reply.error or "")
    assert [a.number for a in reply.attempts] == list(
        range(1, len(fake_provider.chat_requests) + 1)
    )
    assert {a.status_code for a in reply.attempts} <= {429, None}
