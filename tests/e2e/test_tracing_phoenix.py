"""One request, one trace, in a real tracing backend: Arize Phoenix, started for these tests.

``conductor serve`` (embedded) and ``conductor api`` with a planner, an aggregator and a
gateway (distributed, each a process of its own) export their spans over OTLP/HTTP to Phoenix,
configured by the standard OTEL_* variables only. A client sends its ``traceparent`` with a
two-step workflow (the official openai package); the trace read back from Phoenix's REST API
holds the client's span as the parent of everything, a span from every role, the spans nested
as the workflow ran (provider call under its step, step under its workflow), the GenAI
attributes, and no prompt text. A call of a worker whose provider is down leaves spans with
error status. The distributed trace is shown in Phoenix's UI in Chromium and the screenshot is
kept in docs/images.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import yaml
from openai import OpenAI

from conductor_adapters.rpc.v1 import workflows_pb2, workflows_pb2_grpc
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.keys import create_key
from conductor_cli.local_stack import LocalStack, ServiceProcess, free_port

from fakes.api_process import announced_addresses, start_api_beside, start_api_role
from fakes.openai_server import FakeOpenAIServer
from fakes.phoenix import Phoenix, running_phoenix
from fakes.two_step import (
    CALLER_SETTINGS,
    CHECKED,
    SOLVED,
    plan_responder,
    worker_responder,
)

pytestmark = [pytest.mark.processes, pytest.mark.phoenix]

QUESTION = "What is the capital of the secret country Zembla?"
# The spans of the two-step workflow that every runtime writes (the request's, the workflow's,
# its round's and the Conductor's call, its steps' and their calls).
EVERY_SPAN = {
    "POST /v1/chat/completions",
    "workflow",
    "plan round 0",
    "chat fake-conductor",
    "step 0 solver",
    "chat solver",
    "step 1 checker",
    "chat checker",
}
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "trace-in-phoenix.png"


@pytest.fixture(scope="module", autouse=True)
def _unsteered() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name in CALLER_SETTINGS:
            patch.delenv(name, raising=False)
        for name in list(os.environ):
            if name.startswith("OTEL_"):
                patch.delenv(name)
        yield


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as running:
        yield running


@pytest.fixture(scope="module")
def providers() -> Iterator[tuple[FakeOpenAIServer, FakeOpenAIServer]]:
    planner = FakeOpenAIServer(responder=plan_responder)
    workers = FakeOpenAIServer(responder=worker_responder)
    planner.start()
    workers.start()
    yield planner, workers
    planner.stop()
    workers.stop()


def _env(
    directory: Path,
    providers: tuple[FakeOpenAIServer, FakeOpenAIServer],
    phoenix: Phoenix,
    project: str,
) -> dict[str, str]:
    """Workers solver and checker, one whose provider is down, the planner on its fake; and
    tracing, by the standard variables only."""
    planner, workers = providers
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    pool = {
        "workers": {
            name: {
                "provider": "openai-compatible",
                "model": name,
                "base_url": down if name == "broken" else workers.base_url,
                "description": f"worker {name}",
                "price": {"input": 1.0, "output": 2.0},
            }
            for name in ("solver", "checker", "broken")
        }
    }
    pool_file = directory / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(pool, sort_keys=False))
    return {
        "CONDUCTOR_POOL_FILE": str(pool_file),
        "CONDUCTOR_PLANNER_BACKEND": "openai",
        "CONDUCTOR_PLANNER_BASE_URL": planner.base_url,
        "CONDUCTOR_PLANNER_MODEL": "fake-conductor",
        "CONDUCTOR_RETRY_BASE_DELAY_S": "0.05",
        "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _client(url: str, key: str, traceparent: str) -> OpenAI:
    return OpenAI(
        base_url=f"{url}/v1",
        api_key=key,
        max_retries=0,
        timeout=60,
        default_headers={"traceparent": traceparent},
    )


@dataclass
class Traced:
    """A request's spans as Phoenix has them."""

    spans: list[dict[str, Any]]

    def named(self, name: str) -> dict[str, Any]:
        found = [s for s in self.spans if s["name"] == name]
        assert len(found) == 1, (name, sorted(s["name"] for s in self.spans))
        return found[0]

    def parent(self, span: dict[str, Any]) -> dict[str, Any]:
        return next(s for s in self.spans if s["context"]["span_id"] == span["parent_id"])


def _check_workflow_trace(
    traced: Traced, client_span: str, trace_id: str, tenant: str, workers: FakeOpenAIServer
) -> None:
    """One trace under the client's span, nested as the workflow ran, GenAI attributes, no
    prompt text."""
    assert {s["context"]["trace_id"] for s in traced.spans} == {trace_id}
    server = next(s for s in traced.spans if s["parent_id"] == client_span)
    assert server["name"] == "POST /v1/chat/completions"
    workflow = traced.named("workflow")
    assert traced.parent(workflow)["name"] == "POST /v1/chat/completions"
    attributes = workflow["attributes"]
    assert attributes["conductor.variant"] == "conductor-ultra"
    assert attributes["conductor.workflow.status"] == "completed"
    assert attributes["conductor.tenant"] == tenant
    assert attributes["conductor.cost_usd"] > 0

    assert traced.named("plan round 0")["parent_id"] == workflow["context"]["span_id"]
    for step_name, worker in (("step 0 solver", "solver"), ("step 1 checker", "checker")):
        step = traced.named(step_name)
        assert step["parent_id"] == workflow["context"]["span_id"]
        call = traced.named(f"chat {worker}")
        assert call["parent_id"] == step["context"]["span_id"]
        genai = call["attributes"]
        assert genai["gen_ai.operation.name"] == "chat"
        assert genai["gen_ai.provider.name"] == "openai-compatible"
        assert genai["gen_ai.request.model"] == worker
        assert genai["gen_ai.usage.input_tokens"] > 0
        assert genai["gen_ai.usage.output_tokens"] > 0
        # The provider was sent the GenAI span as its caller: its spans join the trace.
        sent = [
            r.headers.get("traceparent", "")
            for r in workers.chat_requests
            if f"-{call['context']['span_id']}-" in r.headers.get("traceparent", "")
        ]
        assert sent == [f"00-{trace_id}-{call['context']['span_id']}-01"]
    conductor_calls = [
        s
        for s in traced.spans
        if s["parent_id"] != workflow["context"]["span_id"]
        and s["attributes"].get("gen_ai.provider.name") == "conductor.planner"
    ]
    assert len(conductor_calls) == 1  # the Conductor's own model call
    recorded = json.dumps([s["attributes"] for s in traced.spans])
    # No prompt, no answer: capture is off.
    assert "Zembla" not in recorded
    assert SOLVED not in recorded


def _check_failed_call(phoenix: Phoenix, project: str, trace_id: str) -> None:
    traced = Traced(phoenix.wait_for_spans(project, trace_id, {"chat broken"}))
    attempts = [s for s in traced.spans if s["name"] == "chat broken"]
    assert attempts
    assert all(s["status_code"] == "ERROR" for s in attempts)
    assert all(s["attributes"]["error.type"] for s in attempts)


# -- embedded ----------------------------------------------------------------------------------


def test_serve_sends_one_trace_per_request_to_phoenix(
    tmp_path: Path, phoenix: Phoenix, providers: tuple[FakeOpenAIServer, FakeOpenAIServer]
) -> None:
    project = "conductor-serve"
    env = {
        "CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'conductor.db'}",
        **_env(tmp_path, providers, phoenix, project),
    }
    serve = start_api_role("serve", tmp_path / "serve.log", env)
    try:
        url, grpc_address = announced_addresses(serve)
        trace_id, client_span, traceparent = _traceparent()
        answer = _client(url, "open", traceparent).chat.completions.create(
            model="conductor-ultra", messages=[{"role": "user", "content": QUESTION}]
        )
        assert answer.choices[0].message.content == CHECKED

        failed_trace, _, failed_parent = _traceparent()
        with pytest.raises(openai.APIError):
            _client(url, "open", failed_parent).chat.completions.create(
                model="broken", messages=[{"role": "user", "content": QUESTION}]
            )
        traced = Traced(phoenix.wait_for_spans(project, trace_id, EVERY_SPAN))
        # An open server: its tenant is "default".
        _check_workflow_trace(traced, client_span, trace_id, "default", providers[1])
        assert {s["attributes"]["conductor.role"] for s in traced.spans} == {"serve"}
        _check_failed_call(phoenix, project, failed_trace)
        _check_grpc_door(phoenix, project, grpc_address)
    finally:
        serve.stop()


def _check_grpc_door(phoenix: Phoenix, project: str, address: str) -> None:
    """A workflow submitted over gRPC with the client's traceparent in its metadata runs
    under the door's server span, in the client's trace."""
    trace_id, client_span, traceparent = _traceparent()
    with grpc.insecure_channel(address) as channel:
        stub = workflows_pb2_grpc.WorkflowsStub(channel)
        stub.Submit(
            workflows_pb2.SubmitRequest(question=QUESTION, variant="conductor-ultra"),
            metadata=(("authorization", "Bearer open"), ("traceparent", traceparent)),
            timeout=30,
        )
    submit = "/conductor.v1.Workflows/Submit"
    traced = Traced(phoenix.wait_for_spans(project, trace_id, {submit, "workflow", "chat checker"}))
    server = traced.named(submit)
    assert server["parent_id"] == client_span
    workflow = traced.named("workflow")
    assert workflow["parent_id"] == server["context"]["span_id"]
    assert workflow["attributes"]["conductor.workflow.status"] == "completed"


# -- distributed -------------------------------------------------------------------------------


@dataclass
class Distributed:
    stack: LocalStack
    api: ServiceProcess
    url: str
    key: str


@pytest.fixture
def distributed(
    tmp_path: Path,
    phoenix: Phoenix,
    providers: tuple[FakeOpenAIServer, FakeOpenAIServer],
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
) -> Iterator[Distributed]:
    upgrade(postgres_url)
    engine = make_engine(postgres_url)
    try:
        key = create_key(engine, "acme").secret
    finally:
        engine.dispose()
    env = {
        "CONDUCTOR_DATABASE_URL": postgres_url,
        "CONDUCTOR_BROKER_URL": redis_url,
        "CONDUCTOR_REDIS_URL": redis_url,
        "CONDUCTOR_REDIS_PREFIX": redis_prefix,
        **_env(tmp_path, providers, phoenix, "conductor-distributed"),
    }
    stack = LocalStack(tmp_path / "logs", env, planner_port=free_port())
    api = start_api_beside(stack, tmp_path / "logs" / "api.log")
    try:
        url, _ = announced_addresses(api)
        yield Distributed(stack, api, url, key)
    finally:
        api.stop()
        stack.stop()


@pytest.mark.postgres
@pytest.mark.broker
@pytest.mark.browser
def test_distributed_roles_send_one_trace_per_request_to_phoenix(
    distributed: Distributed,
    phoenix: Phoenix,
    providers: tuple[FakeOpenAIServer, FakeOpenAIServer],
) -> None:
    project = "conductor-distributed"
    trace_id, client_span, traceparent = _traceparent()
    answer = _client(distributed.url, distributed.key, traceparent).chat.completions.create(
        model="conductor-ultra", messages=[{"role": "user", "content": QUESTION}]
    )
    assert answer.choices[0].message.content == CHECKED
    failed_trace, _, failed_parent = _traceparent()
    with pytest.raises(openai.APIError):
        _client(distributed.url, distributed.key, failed_parent).chat.completions.create(
            model="broken", messages=[{"role": "user", "content": QUESTION}]
        )

    plan_rpc = "/conductor.v1.Planner/Plan"
    # Each process exports on its own schedule: wait for every one's spans.
    traced = Traced(phoenix.wait_for_spans(project, trace_id, {*EVERY_SPAN, plan_rpc}))
    _check_workflow_trace(traced, client_span, trace_id, "acme", providers[1])
    # Every role: the API's request, the aggregator's workflow and round, the planner's
    # gRPC server span under the aggregator's client span, the gateway's steps.
    role = {s["name"]: s["attributes"]["conductor.role"] for s in traced.spans}
    assert role["POST /v1/chat/completions"] == "api"
    assert role["workflow"] == role["plan round 0"] == "aggregator"
    assert role["chat fake-conductor"] == "planner"
    assert role["step 0 solver"] == role["chat checker"] == "gateway"
    rpcs = [s for s in traced.spans if s["name"] == plan_rpc]
    assert len(rpcs) == 2  # client (aggregator) and server (planner)
    ids = {s["context"]["span_id"] for s in rpcs}
    [server] = [s for s in rpcs if s["parent_id"] in ids]
    [client] = [s for s in rpcs if s is not server]
    assert server["parent_id"] == client["context"]["span_id"]
    assert client["parent_id"] == traced.named("plan round 0")["context"]["span_id"]
    _check_failed_call(phoenix, project, failed_trace)
    _screenshot(phoenix, project, trace_id)


def _screenshot(phoenix: Phoenix, project: str, trace_id: str) -> None:
    """The trace in Phoenix's UI, every span name on screen, kept for the docs."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed (apt-get install chromium)")
    url = f"{phoenix.url}/projects/{phoenix.project_id(project)}/traces/{trace_id}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url, wait_until="domcontentloaded")
            tree = page.locator('[data-testid="trace-tree"]')
            for name in ("workflow", "plan round 0", "step 0 solver", "chat checker"):
                heading = tree.locator(".span-node__heading", has_text=name).first
                heading.wait_for(state="visible", timeout=60_000)
            # The selected span's details, else the screenshot can catch them loading (the
            # UI keeps polling: the network never goes idle).
            details = page.locator('[data-testid="span-details"]', has_text="POST /v1/chat")
            details.wait_for(state="visible", timeout=60_000)
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT))
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 10_000
