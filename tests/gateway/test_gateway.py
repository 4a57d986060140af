"""The gateway's policy against the fake providers: retries, Retry-After, cut streams,
fallbacks and cost, every attempt recorded. Real HTTP on loopback; only the provider is fake."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from conductor.chat import ChatMessage, ImagePart, ToolCall
from conductor.errors import StepCallFailed
from conductor.pool import Pool, Price, Provider, Quotas, WorkerSpec
from conductor_cli.local_stack import free_port
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.quotas import QuotaConfig
from conductor_gateway.quotas_redis import RedisQuotas
from conductor_gateway.registry import build_workers
from conductor_gateway.retry import RetryPolicy

from fakes.brokers import private_redis_server
from fakes.openai_server import (
    FakeOpenAIServer,
    completion,
    error,
    openai_compatible_spec,
    streamed,
)
from fakes.scripted import ScriptedWorker

MESSAGES = [ChatMessage(role="user", content="What is 2 + 2?")]
PRICE = Price(input=1.0, cached_input=0.5, output=2.0)


_spec = openai_compatible_spec


@pytest.fixture
async def gateway_for(fake_openai: FakeOpenAIServer) -> AsyncIterator[object]:
    opened: list[WorkerGateway] = []

    def make(*specs: WorkerSpec, policy: RetryPolicy | None = None) -> WorkerGateway:
        pool = Pool(workers=specs or (_spec("primary", fake_openai.base_url),))
        gateway = WorkerGateway(pool, build_workers(pool), policy=policy or RetryPolicy())
        opened.append(gateway)
        return gateway

    yield make
    for gateway in opened:
        await gateway.aclose()


async def test_429_with_retry_after_then_200_succeeds_after_the_wait_with_two_attempts(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    # Given a provider that rate-limits once and asks for one second
    fake_openai.enqueue(
        error(429, "Rate limit reached", code="rate_limit_exceeded", headers={"Retry-After": "1"}),
        completion("4", prompt_tokens=10, completion_tokens=1),
    )
    gateway = gateway_for()

    # When the step calls the worker
    started = time.monotonic()
    result = await gateway.call("primary", MESSAGES)
    elapsed = time.monotonic() - started

    # Then one success, after at least the second asked for, with both attempts recorded
    assert result.text == "4"
    assert elapsed >= 1.0
    assert [(a.number, a.status, a.status_code) for a in result.attempts] == [
        (1, "error", 429),
        (2, "ok", None),
    ]
    assert result.attempts[0].error_class == "RateLimited"
    assert len(fake_openai.chat_requests) == 2


async def test_400_is_not_retried(fake_openai: FakeOpenAIServer, gateway_for) -> None:
    fake_openai.enqueue(error(400, "'messages' is too long"))
    gateway = gateway_for()

    with pytest.raises(StepCallFailed, match="too long") as caught:
        await gateway.call("primary", MESSAGES)

    assert len(fake_openai.chat_requests) == 1
    assert [(a.status, a.error_class) for a in caught.value.attempts] == [
        ("error", "ProviderRejected")
    ]


async def test_a_stream_cut_mid_way_is_retried_and_the_answer_is_the_whole_one(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(
        streamed("The answer is four.", cut_after=3),
        streamed("The answer is 4, complete.", prompt_tokens=10, completion_tokens=6),
    )
    gateway = gateway_for(_spec("primary", fake_openai.base_url, stream=True))

    result = await gateway.call("primary", MESSAGES)

    assert result.text == "The answer is 4, complete."
    assert [a.error_class for a in result.attempts] == ["StreamInterrupted", None]
    assert all(r.json["stream"] is True for r in fake_openai.chat_requests)


async def test_a_call_given_a_receiver_streams_and_hands_it_the_text_as_it_arrives(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    # Given a worker the pool file does not stream
    fake_openai.enqueue(streamed("The answer is four.", pieces=4))
    gateway = gateway_for(_spec("primary", fake_openai.base_url))
    pieces: list[str] = []

    async def keep(text: str) -> None:
        pieces.append(text)

    result = await gateway.call("primary", MESSAGES, deltas=keep)

    assert fake_openai.chat_requests[-1].json["stream"] is True
    assert len(pieces) == 4
    assert "".join(pieces) == result.text == "The answer is four."


async def test_text_that_went_out_is_not_written_again_by_a_retry_or_a_fallback(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    # Given a stream cut after its first piece, a retry allowed and a fallback
    fake_openai.enqueue(streamed("The answer is four.", cut_after=2), streamed("Four."))
    gateway = gateway_for(
        _spec("primary", fake_openai.base_url, fallbacks=["backup"]),
        _spec("backup", fake_openai.base_url),
        policy=RetryPolicy(max_attempts=3, base_delay_s=0.01),
    )
    pieces: list[str] = []

    async def keep(text: str) -> None:
        pieces.append(text)

    # Then the call fails after one attempt: its receiver has shown the piece
    with pytest.raises(StepCallFailed, match="StreamInterrupted") as caught:
        await gateway.call("primary", MESSAGES, deltas=keep)
    assert len(caught.value.attempts) == 1
    assert len(pieces) == 1


async def test_streams_cut_on_every_attempt_are_reported_never_returned_as_an_answer(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(*[streamed("partial text that must not escape", cut_after=2)] * 3)
    gateway = gateway_for(
        _spec("primary", fake_openai.base_url, stream=True),
        policy=RetryPolicy(max_attempts=3, base_delay_s=0.01),
    )

    with pytest.raises(StepCallFailed, match="StreamInterrupted") as caught:
        await gateway.call("primary", MESSAGES)

    assert len(caught.value.attempts) == 3
    assert all(a.status == "error" for a in caught.value.attempts)
    assert "partial text" not in str(caught.value)


async def test_a_stream_that_ends_without_done_is_not_an_answer(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(streamed("half", with_done=False), streamed("whole"))
    gateway = gateway_for(_spec("primary", fake_openai.base_url, stream=True))

    result = await gateway.call("primary", MESSAGES)

    assert result.text == "whole"
    assert result.attempts[0].error_class == "StreamInterrupted"


async def test_503_honours_retry_after_ms(fake_openai: FakeOpenAIServer, gateway_for) -> None:
    fake_openai.enqueue(error(503, "overloaded", headers={"retry-after-ms": "300"}))
    gateway = gateway_for(policy=RetryPolicy(base_delay_s=30.0))  # backoff would wait far longer

    started = time.monotonic()
    result = await gateway.call("primary", MESSAGES)

    assert 0.3 <= time.monotonic() - started < 5
    assert [a.status_code for a in result.attempts] == [503, None]


async def test_exhausted_retries_fall_back_to_the_next_worker_and_attempts_name_each(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(*[error(500, "boom")] * 2)
    primary = _spec("primary", fake_openai.base_url, fallbacks=["backup"])
    backup = _spec("backup", fake_openai.base_url, price=Price(input=10.0, output=10.0))
    gateway = gateway_for(primary, backup, policy=RetryPolicy(max_attempts=2, base_delay_s=0))

    result = await gateway.call("primary", MESSAGES)

    assert result.worker == "backup"
    assert [(a.worker, a.status) for a in result.attempts] == [
        ("primary", "error"),
        ("primary", "error"),
        ("backup", "ok"),
    ]
    assert fake_openai.chat_requests[-1].json["model"] == "model-backup"


async def test_fallbacks_outside_the_allowed_workers_are_never_called(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(*[error(503, "down")] * 3)
    gateway = gateway_for(
        _spec("primary", fake_openai.base_url, fallbacks=["backup", "spare"]),
        _spec("backup", fake_openai.base_url),
        _spec("spare", fake_openai.base_url),
        policy=RetryPolicy(max_attempts=1, base_delay_s=0),
    )

    with pytest.raises(StepCallFailed) as caught:
        await gateway.call("primary", MESSAGES, allowed_workers=["primary", "spare"])
    with pytest.raises(StepCallFailed, match="not among the workers this request may use"):
        await gateway.call("backup", MESSAGES, allowed_workers=["primary"])

    # backup is outside the allowed workers: skipped, and not named to the caller.
    assert [r.json["model"] for r in fake_openai.chat_requests] == ["model-primary", "model-spare"]
    assert "backup" not in str(caught.value)


async def test_a_rejected_request_does_not_fall_back(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(error(422, "unprocessable"))
    gateway = gateway_for(
        _spec("primary", fake_openai.base_url, fallbacks=["backup"]),
        _spec("backup", fake_openai.base_url),
    )

    with pytest.raises(StepCallFailed):
        await gateway.call("primary", MESSAGES)

    assert len(fake_openai.chat_requests) == 1


async def test_cost_is_priced_per_attempt_and_summed_for_the_step(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(
        completion("4", prompt_tokens=1000, completion_tokens=100, cached_tokens=400)
    )
    gateway = gateway_for()

    result = await gateway.call("primary", MESSAGES)

    # 600 uncached x $1/M + 400 cached x $0.5/M + 100 out x $2/M
    expected = (600 * 1.0 + 400 * 0.5 + 100 * 2.0) / 1_000_000
    assert result.attempts[0].cost_usd == pytest.approx(expected)
    assert result.cost_usd == pytest.approx(expected)
    assert result.usage.total_tokens == 1100


async def test_a_timeout_is_retried_and_recorded(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    fake_openai.enqueue(completion("slow", delay_s=5))
    gateway = gateway_for(
        _spec("primary", fake_openai.base_url, timeout_s=0.3),
        policy=RetryPolicy(base_delay_s=0.01),
    )

    result = await gateway.call("primary", MESSAGES)

    assert [a.error_class for a in result.attempts] == ["ProviderTimeout", None]


async def test_over_quota_calls_wait_for_room_and_all_complete(
    fake_openai: FakeOpenAIServer, gateway_for
) -> None:
    import asyncio

    from conductor_gateway.quotas import MemoryQuotas, QuotaConfig

    spec = _spec("primary", fake_openai.base_url, quotas=Quotas(rpm=3))
    gateway = gateway_for(spec)
    # The default skew: without it, uneven delivery delays let the provider see 4 in a window.
    gateway.quotas = MemoryQuotas(QuotaConfig(window_s=0.5, skew_s=0.25))

    results = await asyncio.gather(*[gateway.call("primary", MESSAGES) for _ in range(7)])

    times = sorted(r.received_at for r in fake_openai.chat_requests)
    assert len(results) == 7
    assert all(sum(1 for u in times if t <= u < t + 0.5) <= 3 for t in times)
    assert max(a.quota_wait_ms for r in results for a in r.attempts) > 0


@pytest.mark.processes
async def test_an_answer_is_kept_when_redis_dies_before_its_quota_is_settled(
    fake_openai: FakeOpenAIServer,
) -> None:
    # Given a worker under Redis-kept quotas, on a Redis of the test's own, and a provider that
    # answers after half a second
    port = free_port()
    server = private_redis_server(port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=1)
    spec = _spec("primary", fake_openai.base_url, quotas=Quotas(max_concurrency=2, rpm=100))
    pool = Pool(workers=(spec,))
    gateway = WorkerGateway(
        pool,
        build_workers(pool),
        quotas=RedisQuotas(client, prefix="answer-kept:", config=QuotaConfig(lease_s=3)),
        policy=RetryPolicy(),
    )
    fake_openai.enqueue(completion("4", delay_s=0.5))
    try:
        # When Redis dies while the provider is answering
        call = asyncio.create_task(gateway.call("primary", MESSAGES))
        await asyncio.sleep(0.2)
        server.kill()
        server.wait()
        result = await asyncio.wait_for(call, timeout=20)
    finally:
        server.kill()
        await gateway.aclose()
        await client.aclose()

    # Then the answer paid for comes back (raising would have the call made again)
    assert result.text == "4"
    assert [a.status for a in result.attempts] == ["ok"]
    assert len(fake_openai.chat_requests) == 1


async def test_a_fallback_that_would_drop_images_or_tool_turns_is_skipped(
    fake_openai: FakeOpenAIServer,
) -> None:
    # Given a primary that is down, falling back to a local llama.cpp worker (no images, no
    # tools), and a call showing an image, and one carrying a tool turn
    fake_openai.enqueue(*[error(503, "down")] * 2)
    primary = _spec("primary", fake_openai.base_url, fallbacks=["local"])
    local_spec = WorkerSpec(name="local", provider=Provider.LLAMACPP, model="smol.gguf")
    pool = Pool(workers=(primary, local_spec))
    local = ScriptedWorker("local")
    plain = primary.model_copy(update={"fallbacks": ()})
    workers = {**build_workers(Pool(workers=(plain,))), "local": local}
    gateway = WorkerGateway(pool, workers, policy=RetryPolicy(max_attempts=1, base_delay_s=0))
    image = ImagePart(url="data:image/png;base64,AAAA")
    call = ToolCall(id="c1", name="f", arguments="{}")
    shown = [ChatMessage(role="user", content="What is this?", images=(image,))]
    answered = [
        *MESSAGES,
        ChatMessage(role="assistant", content="", tool_calls=(call,)),
        ChatMessage(role="tool", content="4", tool_call_id="c1"),
    ]

    # When each fails on the primary
    try:
        with pytest.raises(StepCallFailed, match="local: it is not sent images"):
            await gateway.call("primary", shown)
        with pytest.raises(StepCallFailed, match="local: its wire format takes no tools"):
            await gateway.call("primary", answered)
    finally:
        await gateway.aclose()

    # Then the fallback was never sent a lesser request (one without the image or the turns)
    assert local.calls == []
