"""A workflow step is paid for once however often it is sent (issue 36 #13).

Gateway processes (``GatewayProcess``, as a ``conductor gateway`` runs it) on the real Redis,
a fake provider on loopback whose request log counts the calls. Sends of one step: a resend
after the broker lost its messages, a deadline's resend, an outbox sending again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from conductor.chat import ChatMessage
from conductor.messaging import CallReply, CallRequest, StepContext, reply_key, unapplied_key
from conductor.pool import Pool
from conductor_cli.local_stack import free_port
from conductor_gateway.celery_app import CLAIM_RENEW_S, GatewayProcess
from conductor_gateway.registry import build_workers
from conductor_gateway.settings import GatewaySettings

from fakes.brokers import private_redis_server
from fakes.openai_server import FakeOpenAIServer, openai_compatible_spec

pytestmark = pytest.mark.broker


@pytest.fixture
def fake_provider() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(latency_s=0.5) as server:
        yield server


def _gateway(provider: FakeOpenAIServer, redis_url: str, prefix: str) -> GatewayProcess:
    pool = Pool(workers=(openai_compatible_spec("primary", provider.base_url),))
    settings = GatewaySettings(broker_url=redis_url, redis_url=redis_url, redis_prefix=prefix)
    return GatewayProcess(settings, pool, build_workers(pool))


def _send(workflow_id: str, dispatch: int, step: int = 0) -> CallRequest:
    return CallRequest(
        call_id=f"{workflow_id}:{step}:{dispatch}",
        worker="primary",
        messages=[ChatMessage(role="user", content=f"Step {step} of {workflow_id}")],
        reply_to=f"replies:{workflow_id}",
        context=StepContext(workflow_id=workflow_id, step=step, dispatch=dispatch),
    )


def _handle_all(process: GatewayProcess, requests: list[CallRequest]) -> list[CallReply]:
    """Handle the requests at once, each on a thread of its own (as Celery's pool does)."""
    replies: list[CallReply] = []
    threads = [
        threading.Thread(target=lambda r=r: replies.append(process.handle(r, app=None)))  # type: ignore[arg-type,misc]
        for r in requests
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return replies


def test_sends_of_one_step_at_two_gateways_at_once_call_the_provider_once(
    fake_provider: FakeOpenAIServer, redis_url: str, redis_prefix: str
) -> None:
    # Given two gateway processes, and a step sent twice (its resend while the first is in
    # flight), beside another step of the same workflow
    first, second = (_gateway(fake_provider, redis_url, redis_prefix) for _ in range(2))
    workflow_id = str(uuid.uuid4())
    try:
        # When both gateways take the two sends at once, and the second takes the other step
        replies: list[CallReply] = []
        threads = [
            threading.Thread(
                target=lambda p=p, r=r: replies.append(p.handle(r, app=None))  # type: ignore[arg-type,misc]
            )
            for p, r in [
                (first, _send(workflow_id, 1)),
                (second, _send(workflow_id, 2)),
                (second, _send(workflow_id, 1, step=1)),
            ]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        first.close()
        second.close()

    # Then the provider was called once per step, and both sends got the one answer
    assert len(fake_provider.chat_requests) == 2
    by_step = {}
    for reply in replies:
        assert reply.ok, reply.error
        assert reply.context is not None
        by_step.setdefault(reply.context.step, []).append(reply)
    assert len(by_step[0]) == 2
    assert len(by_step[1]) == 1
    assert by_step[0][0].result == by_step[0][1].result


def test_a_resend_after_the_answer_was_recorded_gets_it_without_a_call(
    fake_provider: FakeOpenAIServer, redis_url: str, redis_prefix: str
) -> None:
    # Given a step answered, its answer recorded before it was sent (and that message lost)
    gateway = _gateway(fake_provider, redis_url, redis_prefix)
    workflow_id = str(uuid.uuid4())
    try:
        [answered] = _handle_all(gateway, [_send(workflow_id, 1)])
        with redis.Redis.from_url(redis_url) as client:
            listed = client.zrange(unapplied_key(redis_prefix), 0, -1)
        # When the aggregator sends the step again
        [again] = _handle_all(gateway, [_send(workflow_id, 2)])
    finally:
        gateway.close()

    # Then the provider was called once, the resend answered with the recorded answer, which
    # is listed for the aggregators until one applies it
    assert len(fake_provider.chat_requests) == 1
    assert again.result == answered.result
    assert f"{workflow_id}:0".encode() in listed


def test_a_failed_answer_is_not_reused_a_resend_tries_again(
    fake_provider: FakeOpenAIServer, redis_url: str, redis_prefix: str
) -> None:
    # Given a step whose recorded answer is a failure
    gateway = _gateway(fake_provider, redis_url, redis_prefix)
    workflow_id = str(uuid.uuid4())
    failed = CallReply(call_id=f"{workflow_id}:0:1", ok=False, error="the deadline passed")
    with redis.Redis.from_url(redis_url) as client:
        client.set(reply_key(redis_prefix, f"{workflow_id}:0"), failed.model_dump_json())
    try:
        # When the step is sent again
        [reply] = _handle_all(gateway, [_send(workflow_id, 2)])
    finally:
        gateway.close()

    # Then the provider is called, and its answer stands
    assert reply.ok
    assert len(fake_provider.chat_requests) == 1


@pytest.mark.processes
def test_after_redis_restarted_empty_answers_and_claims_come_back_and_are_not_paid_twice(
    fake_provider: FakeOpenAIServer, redis_prefix: str
) -> None:
    # Given a gateway on a Redis of the test's own, that answered one step (its answer on its
    # way, say) and is calling another when Redis restarts empty
    port = free_port()
    servers = [private_redis_server(port)]
    url = f"redis://127.0.0.1:{port}/0"
    fake_provider.latency_s = 4.0
    holder = _gateway(fake_provider, url, redis_prefix)
    other = _gateway(fake_provider, url, redis_prefix)
    workflow_id = str(uuid.uuid4())
    fake_provider.latency_s = 0.0
    try:
        _handle_all(holder, [_send(workflow_id, 1, step=0)])
        fake_provider.latency_s = 4.0
        in_flight: list[CallReply] = []
        calling = threading.Thread(
            target=lambda: in_flight.append(holder.handle(_send(workflow_id, 1, step=1), app=None))  # type: ignore[arg-type]
        )
        calling.start()
        deadline = time.monotonic() + 10
        while len(fake_provider.chat_requests) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        servers[-1].kill()
        servers[-1].wait(timeout=10)
        servers.append(private_redis_server(port))

        # When the aggregator, told that the broker lost its messages, sends both steps again
        # through another gateway
        resent = _handle_all(other, [_send(workflow_id, 2, step=0), _send(workflow_id, 2, step=1)])
        calling.join(timeout=30)
    finally:
        holder.close()
        other.close()
        servers[-1].kill()
        servers[-1].wait(timeout=10)

    # Then neither step called the provider again: the answered one is written back by the
    # gateway that holds it, the one in flight waits for its first call's answer
    assert len(fake_provider.chat_requests) == 2
    assert all(r.ok for r in [*resent, *in_flight])
    assert CLAIM_RENEW_S < 3.0  # within a resend's grace
