"""``conductor api`` on the Redis broker while that Redis is down (issue 36, "also seen").

A submission used to publish its start message itself, and Celery's publish retries for more
than a minute against a broker that refuses connections: the client waited for Redis to come
back. Now the workflow row and its start message are committed together (the outbox), the
answer goes out at once, and the message is sent once the broker answers again: exactly once,
nothing lost.

The shared test Redis keeps serving the other tests: the API reaches it through a TCP proxy on
loopback (tests/fakes/tcp_proxy.py) that the test cuts, which is what a stopped Redis looks like
from the API. No aggregator runs, so every message the API sends waits in the broker's queue
where the test reads it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import redis
from sqlalchemy import Engine, func, select

from conductor.messaging import AGGREGATOR_QUEUE, START_WORKFLOW_TASK
from conductor_adapters.rpc.v1 import workflows_pb2, workflows_pb2_grpc
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import create_key
from conductor_adapters.store.models import outbox_table, workflow_table
from conductor_cli.local_stack import ServiceProcess

from fakes.api_process import announced_addresses, start_api_role
from fakes.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.processes, pytest.mark.postgres, pytest.mark.broker]

QUESTION = {"question": "What is 6*7?"}
# Far above an answer's milliseconds, far below the minute and more a publish retried for.
ANSWER_WITHIN_S = 15.0


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    address = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    proxy = TcpProxy(address.get("host", "127.0.0.1"), int(address.get("port", 6379)))
    yield proxy
    proxy.cut()


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    upgrade(postgres_url)
    engine = make_engine(postgres_url)
    yield engine
    engine.dispose()


@pytest.fixture
def api(
    tmp_path: Path,
    postgres_url: str,
    engine: Engine,
    redis_url: str,
    redis_prefix: str,
    proxy: TcpProxy,
) -> Iterator[tuple[ServiceProcess, str, str, str]]:
    key = create_key(engine, "acme").secret
    db = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs.get("db", 0)
    proxied = f"redis://127.0.0.1:{proxy.port}/{db}"
    env = {
        "CONDUCTOR_DATABASE_URL": postgres_url,
        "CONDUCTOR_BROKER_URL": proxied,
        "CONDUCTOR_REDIS_URL": proxied,
        "CONDUCTOR_REDIS_PREFIX": redis_prefix,
    }
    process = start_api_role("api", tmp_path / "api.log", env)
    try:
        url, grpc_address = announced_addresses(process)
        yield process, url, grpc_address, key
    finally:
        process.stop()


def _queued_starts(redis_url: str, redis_prefix: str) -> list[str]:
    """The workflows of the start messages waiting in the aggregator queue, one per message."""
    client = redis.Redis.from_url(redis_url)
    try:
        bodies = client.lrange(f"{redis_prefix}{AGGREGATOR_QUEUE}", 0, -1)
    finally:
        client.close()
    starts: list[str] = []
    for raw in bodies:
        message = json.loads(raw)
        if message["headers"]["task"] != START_WORKFLOW_TASK:
            continue
        args, _, _ = json.loads(base64.b64decode(message["body"]))
        starts.append(args[0])
    return starts


def _outbox_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(outbox_table)).scalar() or 0)


def _wait_until_sent(engine: Engine, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while _outbox_rows(engine) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_submission_answers_while_the_broker_is_down_and_its_start_goes_out_once_it_is_back(
    api: tuple[ServiceProcess, str, str, str],
    proxy: TcpProxy,
    engine: Engine,
    redis_url: str,
    redis_prefix: str,
) -> None:
    process, url, grpc_address, key = api
    headers = {"Authorization": f"Bearer {key}"}
    before = httpx.post(f"{url}/v1/workflows", json=QUESTION, headers=headers, timeout=30)
    assert before.status_code == 202, before.text
    _wait_until_sent(engine)
    assert _queued_starts(redis_url, redis_prefix) == [before.json()["id"]]

    # When the broker's Redis goes away and clients submit over every door
    proxy.cut()
    ids: list[str] = []
    started = time.monotonic()
    with httpx.Client(base_url=url, headers=headers, timeout=ANSWER_WITHIN_S) as client:
        for _ in range(3):
            accepted = client.post("/v1/workflows", json=QUESTION)
            assert accepted.status_code == 202, f"{accepted.text}\n{process.tail()}"
            ids.append(accepted.json()["id"])
    with grpc.insecure_channel(grpc_address) as channel:
        reply = workflows_pb2_grpc.WorkflowsStub(channel).Submit(
            workflows_pb2.SubmitRequest(question="What is 6*7?"),
            metadata=(("authorization", f"Bearer {key}"),),
            timeout=ANSWER_WITHIN_S,
        )
        ids.append(reply.workflow_id)
    chat = {"model": "conductor-ultra", "stream": True, "messages": [{"role": "user"}]}
    chat["messages"][0]["content"] = "What is 6*7?"
    with (
        httpx.Client(base_url=url, headers=headers, timeout=ANSWER_WITHIN_S) as client,
        client.stream("POST", "/v1/chat/completions", json=chat) as stream,
    ):
        assert stream.status_code == 200, process.tail()  # the stream has started
    # Then each was answered at once (five answers in the time one publish retries for)
    answered_s = time.monotonic() - started
    print(f"5 submissions answered in {answered_s:.2f} s with the broker down")
    assert answered_s < ANSWER_WITHIN_S
    # and each workflow is recorded queued, its start waiting in the outbox
    with engine.connect() as conn:
        statuses = dict(conn.execute(select(workflow_table.c.id, workflow_table.c.status)).all())
        waiting = list(
            conn.execute(
                select(outbox_table.c.workflow_id).where(outbox_table.c.task == START_WORKFLOW_TASK)
            ).scalars()
        )
    [chat_id] = {str(i) for i in statuses} - {before.json()["id"], *ids}
    ids.append(chat_id)
    assert set(statuses.values()) == {"queued"}
    assert sorted(str(i) for i in waiting) == sorted(ids)

    # When the broker's Redis is back
    proxy.restore()
    back = time.monotonic()
    _wait_until_sent(engine)
    print(f"all sent {time.monotonic() - back:.2f} s after the broker came back")

    # Then every start went out, each once, and nothing is left to send
    assert _outbox_rows(engine) == 0, process.tail()
    starts = _queued_starts(redis_url, redis_prefix)
    assert sorted(starts) == sorted([before.json()["id"], *ids]), process.tail()
