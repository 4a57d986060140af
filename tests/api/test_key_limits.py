"""Per-key limits: requests per minute shared by every API server through Redis, tokens per
minute, workflows at once, and a budget per period; each refusal a 429 with Retry-After."""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from conductor.pool import Price
from conductor_adapters.rpc.v1 import workflows_pb2, workflows_pb2_grpc
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import KeyLimits, create_key
from conductor_api.errors import ApiError
from conductor_api.key_limits import KeyLimiter
from conductor_cli import app as cli_app

from fakes.api_fixture import QUESTION, Api
from fakes.api_server import LiveApi, scripted_service
from fakes.metrics import samples
from fakes.scripted import ScriptedWorker
from fakes.scripted_api_process import ScriptedApiProcess, start_scripted_api

JOB = {"question": "What is 6 * 7?"}


def _post(url: str, key: str, path: str = "/v1/workflows", **body: object) -> httpx.Response:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as h:
        return h.post(path, json=body or JOB)


@pytest.fixture
def two_api_processes(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> Iterator[tuple[Engine, list[str]]]:
    """Two API servers, each an OS process, on one SQLite file (WAL: several processes may
    write it), sharing one Redis for their requests per minute; the database's engine here,
    and the URLs they serve on."""
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    upgrade(url)  # once, before the processes: each would migrate the same file at once
    engine = make_engine(url)
    started: list[ScriptedApiProcess] = []
    try:
        for name in ("api-1", "api-2"):
            started.append(
                start_scripted_api(
                    name, tmp_path, database_url=url, redis_url=redis_url, prefix=redis_prefix
                )
            )
        yield engine, [process.url for process in started]
    finally:
        statuses = [(process, process.stop()) for process in started]
        engine.dispose()
    for process, status in statuses:
        assert status == 0, f"{process.url} exited with {status} on SIGTERM:\n{process.stderr()}"


@pytest.mark.broker
@pytest.mark.processes
def test_requests_per_minute_hold_across_two_api_processes(
    two_api_processes: tuple[Engine, list[str]],
) -> None:
    # Given a key allowed 5 requests a minute, used through two API processes at once (made
    # after they started: a key no server has seen yet is looked up on its first request)
    engine, (first, second) = two_api_processes
    key = create_key(engine, "acme", limits=KeyLimits(rpm_limit=5)).secret

    # When it sends 16 jobs from 8 threads, alternating between the processes
    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(lambda url: _post(url, key), [first, second] * 8))

    # Then 5 are accepted in all, each told how many are left; the rest refused with when to
    # come back
    accepted = [r for r in replies if r.status_code == 202]
    refused = [r for r in replies if r.status_code == 429]
    assert (len(accepted), len(refused)) == (5, 11), [r.text for r in replies]
    # (each a reading taken just after its own request counted: requests counted at once may
    # read the same number, and the last one counted reads 0)
    remaining = [int(r.headers["x-ratelimit-remaining-requests"]) for r in accepted]
    assert all(0 <= left <= 4 for left in remaining), remaining
    assert min(remaining) == 0, remaining
    for reply in refused:
        assert reply.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(reply.headers["Retry-After"]) <= 60
        assert reply.headers["x-should-retry"] == "true"


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
def test_a_budget_stops_its_key_until_the_period_ends(tmp_path: Path) -> None:
    # Given workers that cost money, and a key with a budget smaller than one workflow
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    price = Price(input=100.0, output=100.0)  # USD per million tokens
    workers = [ScriptedWorker("alpha"), ScriptedWorker("beta")]
    server = LiveApi(lambda: scripted_service(url, workers, price=price), metrics_port=0)
    try:
        limits = KeyLimits(budget_usd=0.001, budget_period="day")
        key = create_key(server.service.engine, "acme", limits=limits)
        other = create_key(server.service.engine, "acme").secret
        chat = {"model": "conductor-ultra", "messages": QUESTION}

        # When it asks twice, and another key once
        first = _post(server.url, key.secret, "/v1/chat/completions", **chat)
        second = _post(server.url, key.secret, "/v1/chat/completions", **chat)
        unlimited = _post(server.url, other, "/v1/chat/completions", **chat)
        with httpx.Client(base_url=server.metrics_url) as http:
            metrics = samples(http.get("/metrics").text)
    finally:
        server.close()

    # Then the first ran with its budget shown, the second was refused until midnight UTC
    assert first.status_code == 200, first.text
    assert first.json()["conductor"]["cost_usd"] > 0.001
    assert float(first.headers["x-conductor-budget-remaining-usd"]) == pytest.approx(0.001)
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "budget_exceeded"
    assert second.headers["x-should-retry"] == "false"
    assert second.headers["x-conductor-budget-remaining-usd"] == "0.000000"
    assert 0 < int(second.headers["Retry-After"]) <= 86_400
    assert unlimited.status_code == 200
    gauge = ("conductor_api_key_budget_remaining_usd", (("key_id", key.key.id),))
    assert metrics[gauge] == 0
    refusals = ("conductor_api_key_limit_refusals_total", (("reason", "budget_exceeded"),))
    assert metrics[refusals] == 1


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
def test_a_key_at_its_concurrency_limit_waits_for_a_workflow_to_end(api: Api) -> None:
    key = create_key(api.server.service.engine, "acme", limits=KeyLimits(max_concurrent=1))
    slow = {"question": "What is 6 * 7?", "pool": ["slow"]}
    first = _post(api.url, key.secret, **slow)
    busy = _post(api.url, key.secret, **slow)
    # A pass-through call is not a workflow: it does not count
    direct = _post(api.url, key.secret, "/v1/chat/completions", model="alpha", messages=QUESTION)
    with httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {key.secret}"}, timeout=30
    ) as http:
        http.post(f"/v1/workflows/{first.json()['id']}/cancel")
    after = _post(api.url, key.secret)

    assert first.status_code == 202
    assert busy.status_code == 429
    assert busy.json()["error"]["code"] == "concurrency_limit_exceeded"
    assert direct.status_code == 200
    assert after.status_code == 202


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
def test_tokens_per_minute_count_the_workflows_that_ended(api: Api) -> None:
    # Given a key allowed 50 tokens a minute; a workflow here spends more (its Conductor 120)
    key = create_key(api.server.service.engine, "acme", limits=KeyLimits(tpm_limit=50))
    chat = {"model": "conductor-mini", "messages": QUESTION}

    first = _post(api.url, key.secret, "/v1/chat/completions", **chat)
    second = _post(api.url, key.secret, "/v1/chat/completions", **chat)

    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining-tokens"] == "50"
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "tokens_limit_exceeded"
    assert second.headers["x-ratelimit-remaining-tokens"] == "0"
    assert 1 <= int(second.headers["Retry-After"]) <= 60


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
def test_workers_called_directly_count_against_tokens_per_minute_and_the_budget(
    tmp_path: Path,
) -> None:
    # Given a worker that costs money (a call here: 4 prompt and 1 completion tokens), a key
    # with a budget smaller than one call, and a key allowed 4 tokens a minute
    url = f"sqlite:///{tmp_path / 'conductor.db'}"
    price = Price(input=100.0, output=100.0)  # USD per million tokens
    server = LiveApi(lambda: scripted_service(url, [ScriptedWorker("alpha")], price=price))
    direct = {"model": "alpha", "messages": [{"role": "user", "content": "one two three four"}]}
    try:
        engine = server.service.engine
        budget = KeyLimits(budget_usd=0.0001, budget_period="day")
        budgeted = create_key(engine, "acme", limits=budget).secret
        metered = create_key(engine, "acme", limits=KeyLimits(tpm_limit=4)).secret

        # When each calls alpha directly, twice (no workflow: a pass-through)
        spent = [_post(server.url, budgeted, "/v1/chat/completions", **direct) for _ in "12"]
        tokens = [_post(server.url, metered, "/v1/chat/completions", **direct) for _ in "12"]
    finally:
        server.close()

    # Then the first calls went through and their spend counted: the second of each is refused
    assert [r.status_code for r in spent] == [200, 429], spent[1].text
    assert spent[1].json()["error"]["code"] == "budget_exceeded"
    assert [r.status_code for r in tokens] == [200, 429], tokens[1].text
    assert tokens[1].json()["error"]["code"] == "tokens_limit_exceeded"


@pytest.mark.slow  # its rule runs without a server in the fast tier: test_service.py
def test_grpc_submissions_count_against_the_same_limits(api: Api) -> None:
    key = create_key(api.server.service.engine, "acme", limits=KeyLimits(rpm_limit=1))
    metadata = [("authorization", f"Bearer {key.secret}")]
    with grpc.insecure_channel(api.server.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        stub.Submit(workflows_pb2.SubmitRequest(question="6 * 7"), metadata=metadata, timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Submit(
                workflows_pb2.SubmitRequest(question="6 * 7"), metadata=metadata, timeout=10
            )
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "1 requests per minute" in (refused.value.details() or "")


def test_conductor_keys_sets_and_shows_limits(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'keys.db'}"}
    assert runner.invoke(cli_app, ["db", "upgrade"], env=env).exit_code == 0
    made = runner.invoke(
        cli_app,
        [
            "keys",
            "create",
            "--tenant",
            "acme",
            "--rpm",
            "60",
            "--budget-usd",
            "5",
            "--budget-period",
            "month",
        ],
        env=env,
    )
    assert made.exit_code == 0, made.output
    listed = runner.invoke(cli_app, ["keys", "list"], env=env).stdout
    assert '"rpm_limit": 60' in listed
    assert '"budget_usd": 5.0' in listed
    key_id = listed.split('"id": "')[1].split('"')[0]
    changed = runner.invoke(cli_app, ["keys", "limit", key_id, "--concurrency", "2"], env=env)
    assert changed.exit_code == 0, changed.output
    assert '"max_concurrent": 2' in changed.stdout
    assert '"rpm_limit": null' in changed.stdout  # limits are replaced, not merged
    no_period = runner.invoke(cli_app, ["keys", "limit", key_id, "--budget-usd", "1"], env=env)
    assert no_period.exit_code != 0
    assert "a budget needs its period" in str(no_period.exception)
    unknown = runner.invoke(cli_app, ["keys", "limit", uuid.uuid4().hex[:12]], env=env)
    assert unknown.exit_code != 0


async def test_requests_per_minute_are_counted_in_this_process_while_redis_is_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the distributed API's limiter, whose Redis does not answer (a port nobody listens
    # on), and a key allowed 2 requests a minute
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: nothing listens there
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    limiter = KeyLimiter.on_redis(engine, f"redis://127.0.0.1:{port}/0", "test:")
    limits = KeyLimits(rpm_limit=2)

    # When the key sends three requests
    with caplog.at_level(logging.WARNING):
        first = await limiter.admit("key-1", limits, starts_workflow=True)
        second = await limiter.admit("key-1", limits, starts_workflow=True)
        with pytest.raises(ApiError) as third:
            await limiter.admit("key-1", limits, starts_workflow=True)
    engine.dispose()

    # Then each is judged, not answered 500: two admitted and the third refused, counted in
    # this process for as long as Redis is away, and the log says so once
    assert first["x-ratelimit-remaining-requests"] == "1"
    assert second["x-ratelimit-remaining-requests"] == "0"
    assert third.value.status == 429
    assert caplog.text.count("counted in this process") == 1
