"""``conductor api`` (the distributed API role) while its PostgreSQL is down (issue 36 #9).

The shared test server must keep serving the other tests, so it is not stopped: the API reaches
it through a TCP proxy on loopback (tests/fakes/tcp_proxy.py) that the test cuts. A cut proxy
is what a stopped server looks like from the API: its port refuses new connections and the
pooled ones are reset. Then every request must have an answer: a submission 503 with the
error body ``conductor serve`` gives (code database_unavailable) and Retry-After, bad input
400 as always (it is judged before the database is asked), readiness 503, gRPC UNAVAILABLE;
once the proxy listens again, submissions are accepted again without a restart.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from sqlalchemy.engine import make_url

from conductor_adapters.rpc.v1 import workflows_pb2, workflows_pb2_grpc
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import create_key
from conductor_cli.local_stack import ServiceProcess

from fakes.api_process import announced_addresses, start_api_role
from fakes.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.processes, pytest.mark.postgres, pytest.mark.broker]

QUESTION = {"question": "What is 6*7?"}


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[TcpProxy]:
    url = make_url(postgres_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    yield proxy
    proxy.cut()


@pytest.fixture
def api(
    tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str, proxy: TcpProxy
) -> Iterator[tuple[ServiceProcess, str, str, str]]:
    upgrade(postgres_url)
    engine = make_engine(postgres_url)
    try:
        key = create_key(engine, "acme").secret
    finally:
        engine.dispose()
    proxied = make_url(postgres_url).set(host="127.0.0.1", port=proxy.port)
    env = {
        "CONDUCTOR_DATABASE_URL": proxied.render_as_string(hide_password=False),
        "CONDUCTOR_BROKER_URL": redis_url,
        "CONDUCTOR_REDIS_URL": redis_url,
        "CONDUCTOR_REDIS_PREFIX": redis_prefix,
    }
    process = start_api_role("api", tmp_path / "api.log", env)
    try:
        url, grpc_address = announced_addresses(process)
        yield process, url, grpc_address, key
    finally:
        process.stop()


def _outage_answer(url: str, key: str, method: str, path: str, body: object) -> httpx.Response:
    # A connection of its own per request: a dropped one shows as an exception here.
    with httpx.Client(base_url=url, timeout=30) as client:
        return client.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})


def test_api_answers_503_while_its_database_is_down_and_recovers(
    api: tuple[ServiceProcess, str, str, str], proxy: TcpProxy
) -> None:
    process, url, grpc_address, key = api
    headers = {"Authorization": f"Bearer {key}"}
    accepted = httpx.post(f"{url}/v1/workflows", json=QUESTION, headers=headers, timeout=30)
    assert accepted.status_code == 202, accepted.text

    proxy.cut()
    requests = [("POST", "/v1/workflows", QUESTION)] * 24 + [
        ("GET", "/v1/workflows/not-a-uuid", None),
        ("POST", "/v1/workflows", {"question": ""}),
        ("GET", f"/v1/workflows/{accepted.json()['id']}", None),
        ("GET", "/v1/workflows", None),
    ] * 3
    with concurrent.futures.ThreadPoolExecutor(8) as threads:
        answers = list(
            threads.map(lambda r: _outage_answer(url, key, *r), requests)
        )  # raises on a connection closed without an answer
    for (method, path, body), answer in zip(requests, answers, strict=True):
        said = f"{method} {path} {body}: {answer.status_code} {answer.text}\n{process.tail()}"
        if path.endswith("not-a-uuid") or body == {"question": ""}:
            assert answer.status_code == 400, said
            continue
        assert answer.status_code == 503, said
        assert answer.json()["error"]["code"] == "database_unavailable", said
        assert answer.json()["error"]["type"] == "server_error", said
        assert int(answer.headers["retry-after"]) > 0, said
    ready = httpx.get(f"{url}/readyz", timeout=30)
    assert ready.status_code == 503, ready.text
    with grpc.insecure_channel(grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Submit(
                workflows_pb2.SubmitRequest(question="What is 6*7?"),
                metadata=(("authorization", f"Bearer {key}"),),
                timeout=30,
            )
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()

    proxy.restore()
    deadline = time.monotonic() + 30
    while True:
        again = httpx.post(f"{url}/v1/workflows", json=QUESTION, headers=headers, timeout=30)
        if again.status_code == 202 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert again.status_code == 202, again.text
