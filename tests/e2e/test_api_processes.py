"""The public API as users start it: ``conductor serve`` and ``conductor api`` processes.

Real processes (conductor_cli.local_stack.ServiceProcess) on free ports, driven with the official
``openai`` package, plain HTTP and gRPC. The planner model and the workers are fake
OpenAI-compatible servers on loopback: the planner's answer is a two-step plan (solve, then
check with everything), the workers answer according to the subtask they were given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
import yaml
from openai import OpenAI

from conductor_adapters.rpc.v1 import workflows_pb2, workflows_pb2_grpc
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import KEY_CACHE_S, create_key
from conductor_cli.local_stack import ENTRY, LocalStack, ServiceProcess, free_port

from fakes.api_process import announced_addresses, start_api_beside, start_api_role
from fakes.openai_server import FakeOpenAIServer
from fakes.two_step import (
    CALLER_SETTINGS,
    CHECKED,
    SOLVED,
    plan_responder,
    worker_responder,
)

pytestmark = [pytest.mark.processes]

CONDUCTOR = [sys.executable, "-c", ENTRY]
QUESTION = "What is 2 + 2?"
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@pytest.fixture(scope="module", autouse=True)
def _unsteered() -> Iterator[None]:
    """The processes see only the settings the tests give them (ServiceProcess and
    subprocess get os.environ plus those), not the caller's CONDUCTOR_ variables."""
    with pytest.MonkeyPatch.context() as patch:
        for name in CALLER_SETTINGS:
            patch.delenv(name, raising=False)
        yield


@dataclass
class Fakes:
    planner: FakeOpenAIServer
    workers: FakeOpenAIServer


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    planner = FakeOpenAIServer(responder=plan_responder)
    workers = FakeOpenAIServer(responder=worker_responder)
    planner.start()
    workers.start()
    yield Fakes(planner, workers)
    planner.stop()
    workers.stop()


def _model_env(fakes: Fakes, directory: Path) -> dict[str, str]:
    """Pool file (workers solver and checker on the fake) and the planner on its fake."""
    pool = {
        "workers": {
            name: {
                "provider": "openai-compatible",
                "model": name,
                "base_url": fakes.workers.base_url,
                "description": f"worker {name}",
                "price": {"input": 1.0, "output": 2.0},
            }
            for name in ("solver", "checker")
        }
    }
    pool_file = directory / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(pool, sort_keys=False))  # Model 0 = solver
    return {
        "CONDUCTOR_POOL_FILE": str(pool_file),
        "CONDUCTOR_PLANNER_BACKEND": "openai",
        "CONDUCTOR_PLANNER_BASE_URL": fakes.planner.base_url,
        "CONDUCTOR_PLANNER_MODEL": "fake-conductor",
    }


def _conductor(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CONDUCTOR, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def _client(url: str, key: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def _ask(client: OpenAI) -> Any:
    return client.chat.completions.create(
        model="conductor-ultra", messages=[{"role": "user", "content": QUESTION}]
    )


# -- embedded: conductor serve --------------------------------------------------------------


def test_serve_answers_openly_until_a_key_exists_then_only_with_keys(
    tmp_path: Path, fakes: Fakes
) -> None:
    # Given `conductor serve` on a fresh SQLite file, with no key made yet
    env = {
        "CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'data' / 'conductor.db'}",
        **_model_env(fakes, tmp_path),
    }
    serve = start_api_role("serve", tmp_path / "serve.log", env)
    try:
        url, _ = announced_addresses(serve)
        assert "conductor serve: no API key exists: open" in serve.tail()

        # When a client with any key asks the ultra variant
        response = _ask(_client(url, "anything"))

        # Then the answer is the last worker's, with the workflow in the conductor field
        assert response.choices[0].message.content == CHECKED
        assert response.model == "conductor-ultra"
        extra = (response.model_extra or {})["conductor"]
        assert extra["status"] == "completed"
        assert response.id == f"chatcmpl-{uuid.UUID(extra['workflow_id']).hex}"
        assert [s["worker"] for s in extra["steps"]] == ["solver", "checker"]
        assert [s["output"] for s in extra["steps"]] == [SOLVED, CHECKED]
        assert response.usage is not None
        assert response.usage.total_tokens > 0

        # When an operator makes a key
        made = _conductor(["keys", "create", "--tenant", "acme"], env)
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip().splitlines()[0]
        assert key.startswith("cnd_")
        time.sleep(KEY_CACHE_S)  # the open answer is reused this long

        # Then a wrong key is refused, and the new key is served
        with pytest.raises(openai.AuthenticationError) as refused:
            _ask(_client(url, "anything"))
        assert refused.value.code == "invalid_api_key"
        assert _ask(_client(url, key)).choices[0].message.content == CHECKED
    finally:
        serve.stop()

    # And SIGTERM stops it cleanly
    assert serve.process is not None
    assert serve.process.returncode == 0, serve.tail()
    assert "conductor serve: stopped" in serve.tail()


def _events(url: str, workflow_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The workflow's event stream, read to its end: (event, data) pairs."""
    events: list[tuple[str, dict[str, Any]]] = []
    kind = ""
    with (
        httpx.Client(base_url=url, timeout=30) as http,
        http.stream("GET", f"/v1/workflows/{workflow_id}/events") as response,
    ):
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
    return events


def test_jobs_of_a_killed_serve_end_failed_with_the_reason_after_a_restart(
    tmp_path: Path, fakes: Fakes
) -> None:
    # Given `conductor serve` with 5 jobs whose workers take 60 s
    env = {
        "CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'conductor.db'}",
        "CONDUCTOR_RUNNER_HEARTBEAT_S": "0.5",
        "CONDUCTOR_RUNNER_STALE_AFTER_S": "3",
        **_model_env(fakes, tmp_path),
    }
    fakes.workers.latency_s = 60.0
    serve = start_api_role("serve", tmp_path / "serve.log", env)
    try:
        url, _ = announced_addresses(serve)
        with httpx.Client(base_url=url, timeout=30) as http:
            ids = [
                http.post("/v1/workflows", json={"question": f"job {n}"}).json()["id"]
                for n in range(5)
            ]
        deadline = time.monotonic() + 30
        while fakes.workers.in_flight < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fakes.workers.in_flight >= 5, serve.tail()

        # When it is killed, and started again on the same database
        serve.kill()
        killed = time.monotonic()
        restarted = start_api_role("serve", tmp_path / "restarted.log", env)
    finally:
        fakes.workers.latency_s = 0.0
        serve.kill()
    try:
        url, _ = announced_addresses(restarted)
        streams = [_events(url, workflow_id) for workflow_id in ids]  # each ends, or times out
        ended_within_s = time.monotonic() - killed
        with httpx.Client(base_url=url, timeout=30) as http:
            jobs = [http.get(f"/v1/workflows/{workflow_id}").json() for workflow_id in ids]
    finally:
        restarted.stop()

    # Then every job ended failed, with the reason, in its record and its event stream
    assert ended_within_s < 60
    assert [job["status"] for job in jobs] == ["failed"] * 5
    assert all("server running this workflow stopped" in job["error"] for job in jobs)
    assert all(step["status"] != "running" for job in jobs for step in job["steps"])
    for events in streams:
        kinds = [kind for kind, _ in events]
        assert kinds[-1] == "failed", kinds
        assert kinds.count("failed") == 1
        assert "server running this workflow stopped" in events[-1][1]["data"]["error"]
    assert [e[1]["sequence"] for e in streams[0]] == list(range(1, len(streams[0]) + 1))


def test_serve_on_all_addresses_without_a_key_is_refused(tmp_path: Path) -> None:
    done = _conductor(
        ["serve", "--host", "0.0.0.0", "--port", "0", "--grpc-port", "-1"],
        {"CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'conductor.db'}"},
    )
    assert done.returncode != 0
    assert "no API key exists" in done.stderr
    assert "conductor keys create" in done.stderr
    assert "serving on" not in done.stdout


# -- distributed: conductor api -------------------------------------------------------------


def test_api_without_a_broker_is_refused(tmp_path: Path) -> None:
    done = _conductor(
        ["api", "--port", "0", "--grpc-port", "-1"],
        {"CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'conductor.db'}"},
    )
    assert done.returncode != 0
    assert "CONDUCTOR_BROKER_URL" in done.stderr
    assert "serving on" not in done.stdout


@pytest.mark.postgres
@pytest.mark.broker
def test_api_without_a_key_is_refused(postgres_url: str, redis_url: str) -> None:
    upgrade(postgres_url)
    done = _conductor(
        ["api", "--port", "0", "--grpc-port", "-1"],
        {"CONDUCTOR_DATABASE_URL": postgres_url, "CONDUCTOR_BROKER_URL": redis_url},
    )
    assert done.returncode != 0
    assert "conductor keys create" in done.stderr
    assert "serving on" not in done.stdout


@dataclass
class Distributed:
    stack: LocalStack
    api: ServiceProcess
    url: str
    grpc_address: str
    key: str

    def logs(self) -> str:
        processes = [*self.stack.processes, self.api]
        return "\n".join(f"--- {p.name}\n{p.tail(2000)}" for p in processes)


@pytest.fixture(scope="module")
def distributed(
    tmp_path_factory: pytest.TempPathFactory,
    fakes: Fakes,
    module_postgres_url: str,
    redis_url: str,
    module_redis_prefix: str,
) -> Iterator[Distributed]:
    """Planner, one aggregator and one gateway on the Redis broker, and `conductor api`."""
    directory = tmp_path_factory.mktemp("distributed")
    upgrade(module_postgres_url)
    engine = make_engine(module_postgres_url)
    try:
        key = create_key(engine, "acme").secret
    finally:
        engine.dispose()
    env = {
        "CONDUCTOR_DATABASE_URL": module_postgres_url,
        "CONDUCTOR_BROKER_URL": redis_url,
        "CONDUCTOR_REDIS_URL": redis_url,
        "CONDUCTOR_REDIS_PREFIX": module_redis_prefix,
        "CONDUCTOR_SWEEP_INTERVAL_S": "0.5",
        "CONDUCTOR_RETRY_BASE_DELAY_S": "0.1",
        **_model_env(fakes, directory),
    }
    stack = LocalStack(directory / "logs", env, planner_port=free_port())
    api = start_api_beside(stack, directory / "logs" / "api.log")
    try:
        url, grpc_address = announced_addresses(api)
        yield Distributed(stack, api, url, grpc_address, key)
    finally:
        api.stop()
        stack.stop()


def _workflow(d: Distributed, workflow_id: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {d.key}"}
    reply = httpx.get(f"{d.url}/v1/workflows/{workflow_id}", headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def _usage(usage: Any) -> tuple[int, int, int]:
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


@pytest.mark.postgres
@pytest.mark.broker
def test_distributed_completion_counts_the_workflows_usage(distributed: Distributed) -> None:
    # When a client asks the ultra variant through the distributed API
    try:
        response = _ask(_client(distributed.url, distributed.key))
    except openai.APIError:
        pytest.fail(f"the request failed; the logs:\n{distributed.logs()}")

    # Then the last worker answers, and usage is everything the workflow spent
    assert response.choices[0].message.content == CHECKED
    extra = (response.model_extra or {})["conductor"]
    assert [s["worker"] for s in extra["steps"]] == ["solver", "checker"]
    stored = _workflow(distributed, extra["workflow_id"])
    assert stored["status"] == "completed"
    assert stored["answer"] == CHECKED
    assert response.usage is not None
    expected = stored["usage"]
    assert _usage(response.usage) == (
        expected["prompt_tokens"],
        expected["completion_tokens"],
        expected["total_tokens"],
    )
    assert expected["total_tokens"] > 0


@pytest.mark.postgres
@pytest.mark.broker
def test_distributed_stream_ends_with_the_workflows_usage(distributed: Distributed) -> None:
    # When a client streams the answer and asks for usage
    stream = _client(distributed.url, distributed.key).chat.completions.create(
        model="conductor-ultra",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    # Then the content is the answer, the workflow id comes first, the usage chunk last
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == CHECKED
    workflow_id = (chunks[0].model_extra or {})["conductor"]["workflow_id"]
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"]
    assert len(finish) == 1
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    stored = _workflow(distributed, workflow_id)
    expected = stored["usage"]
    assert _usage(chunks[-1].usage) == (
        expected["prompt_tokens"],
        expected["completion_tokens"],
        expected["total_tokens"],
    )


@pytest.mark.postgres
@pytest.mark.broker
def test_distributed_readiness_checks_every_dependency(distributed: Distributed) -> None:
    reply = httpx.get(f"{distributed.url}/readyz", timeout=30)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["status"] == "ready"
    assert body["mode"] == "distributed"
    for check in ("database", "broker", "redis", "planner"):
        assert body[check] == "ok", body


@pytest.mark.postgres
@pytest.mark.broker
def test_grpc_watch_replays_a_finished_workflows_events(distributed: Distributed) -> None:
    # Given a finished workflow
    response = _ask(_client(distributed.url, distributed.key))
    workflow_id = (response.model_extra or {})["conductor"]["workflow_id"]

    # When a gRPC client watches it
    with grpc.insecure_channel(distributed.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        events = list(
            stub.Watch(
                workflows_pb2.WatchRequest(workflow_id=workflow_id),
                metadata=[("authorization", f"Bearer {distributed.key}")],
                timeout=30,
            )
        )

    # Then every event comes back in order, ending with the outcome
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert {e.workflow_id for e in events} == {workflow_id}
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "plan"
    assert kinds.count("step_finished") == 2
    assert kinds[-1] == "completed"
    assert events[-1].completed.answer == CHECKED


@pytest.mark.postgres
@pytest.mark.broker
def test_grpc_without_a_key_is_unauthenticated(distributed: Distributed) -> None:
    with grpc.insecure_channel(distributed.grpc_address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Get(workflows_pb2.GetRequest(workflow_id=ZERO_UUID), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.postgres
@pytest.mark.broker
def test_api_stops_cleanly_on_sigterm(distributed: Distributed) -> None:
    """Last of the module: it stops the shared api process (the fixture's stop is then a no-op)."""
    distributed.api.stop()
    assert distributed.api.process is not None
    assert distributed.api.process.returncode == 0, distributed.api.tail()
    assert "conductor api: stopped" in distributed.api.tail()
