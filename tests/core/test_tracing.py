"""The spans of a workflow, with the SDK's in-memory exporter.

The embedded executor runs real planner, parser, gateway and state machine around scripted
workers; the distributed helpers are checked for the ids a workflow's spans share across
processes (the gateway's step span under the workflow span the aggregator writes last).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import StatusCode

from conductor import tracing
from conductor.errors import ConfigurationError, ProviderRejected
from conductor.executor import WorkflowExecutor
from conductor.variants import BUILTIN_VARIANTS
from conductor.workflow import WorkflowRecord, WorkflowStatus
from conductor_adapters import telemetry
from conductor_planner import ConductorPlanner

from fakes.scripted import ScriptedBackend, ScriptedWorker, lists, named_pool, scripted_gateway

ULTRA = BUILTIN_VARIANTS["conductor-ultra"]
QUESTION = "What is the capital of the secret country Zembla?"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider() -> TracerProvider:
    """One provider per test process (OpenTelemetry sets the global one once), its ids as
    the telemetry module makes them, exporting to memory."""
    made = telemetry.new_tracer_provider("test")
    made.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(made)
    if trace.get_tracer_provider() is not made:
        pytest.fail("another test set the global tracer provider first")
    return made


@pytest.fixture
def spans(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """Tracing on for one test; the helpers off again after it (other tests make no span)."""
    _EXPORTER.clear()
    tracing.set_tracing(enabled=True)
    try:
        yield _EXPORTER
    finally:
        tracing.set_tracing(enabled=False)
        _EXPORTER.clear()


def _run(workers: list[ScriptedWorker], plan: str, *, trace_parent: str | None = None) -> None:
    pool = named_pool([w.name for w in workers])
    executor = WorkflowExecutor(
        planner=ConductorPlanner(ScriptedBackend([plan])),
        pool=pool,
        gateway=scripted_gateway(pool, {w.name: w for w in workers}),
    )
    record = asyncio.run(executor.run(QUESTION, ULTRA, tenant="acme", trace_parent=trace_parent))
    assert record.status in (WorkflowStatus.COMPLETED, WorkflowStatus.FAILED)


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in finished}


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_workflow_is_one_trace_of_nested_spans_with_genai_attributes(
    spans: InMemorySpanExporter,
) -> None:
    workers = [ScriptedWorker("alpha"), ScriptedWorker("beta")]
    plan = lists([0, 1], ["Draft it.", "Check it."], [[], [0]])
    _run(workers, plan, trace_parent=CLIENT_PARENT)

    got = _by_name(spans.get_finished_spans())
    assert {"workflow", "plan round 0", "step 0 alpha", "step 1 beta"} <= set(got)
    assert {"chat alpha", "chat beta"} <= set(got)
    workflow = got["workflow"]
    # In the client's trace, under its span.
    assert {s.context.trace_id for s in got.values()} == {int(CLIENT_TRACE, 16)}
    assert {dict(s.attributes or {})[telemetry.ROLE] for s in got.values()} == {"test"}
    assert _parent_id(workflow) == int("b7ad6b7169203331", 16)
    ids = workflow.context.span_id
    assert _parent_id(got["plan round 0"]) == ids
    # The Conductor's own model call, under its round.
    assert _parent_id(got["chat scripted"]) == got["plan round 0"].context.span_id
    assert dict(got["chat scripted"].attributes or {})["gen_ai.usage.input_tokens"] == 100
    assert _parent_id(got["step 0 alpha"]) == ids
    assert _parent_id(got["chat alpha"]) == got["step 0 alpha"].context.span_id
    assert _parent_id(got["chat beta"]) == got["step 1 beta"].context.span_id

    attributes = dict(workflow.attributes or {})
    assert attributes[tracing.VARIANT] == "conductor-ultra"
    assert attributes[tracing.TENANT] == "acme"
    assert attributes[tracing.STATUS] == "completed"
    assert uuid.UUID(str(attributes[tracing.WORKFLOW_ID]))
    call = dict(got["chat alpha"].attributes or {})
    assert call["gen_ai.operation.name"] == "chat"
    assert call["gen_ai.provider.name"] == "openai-compatible"
    assert call["gen_ai.request.model"] == "alpha"
    assert call["gen_ai.response.model"] == "alpha"
    assert call["gen_ai.usage.output_tokens"] == 1  # "alpha-answer-1": a word a token
    assert call["gen_ai.response.finish_reasons"] == ("stop",)
    assert got["chat alpha"].kind is trace.SpanKind.CLIENT
    assert workflow.status.status_code is StatusCode.UNSET


def test_prompts_and_answers_are_not_recorded_unless_capture_is_on(
    spans: InMemorySpanExporter,
) -> None:
    plan = lists([0], ["Answer the question."], [[]])
    _run([ScriptedWorker("alpha", answer=lambda _: "Zembla City")], plan)
    recorded = json.dumps([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    assert "Zembla" not in recorded
    assert "gen_ai.input.messages" not in recorded

    spans.clear()
    tracing.set_tracing(enabled=True, capture_content=True)
    _run([ScriptedWorker("alpha", answer=lambda _: "Zembla City")], plan)
    call = dict(_by_name(spans.get_finished_spans())["chat alpha"].attributes or {})
    assert "secret country Zembla" in str(call["gen_ai.input.messages"])
    output = json.loads(str(call["gen_ai.output.messages"]))
    assert output[0]["parts"][0]["content"] == "Zembla City"


def test_a_failed_provider_call_has_error_status_and_type(spans: InMemorySpanExporter) -> None:
    refused = ProviderRejected("alpha: 400 bad request: the prompt says secret", status_code=400)
    _run([ScriptedWorker("alpha", fail_with=refused)], lists([0], ["Answer."], [[]]))
    got = _by_name(spans.get_finished_spans())
    call = got["chat alpha"]
    assert call.status.status_code is StatusCode.ERROR
    assert dict(call.attributes or {})["error.type"] == "ProviderRejected"
    assert "secret" not in (call.status.description or "")
    assert got["step 0 alpha"].status.status_code is StatusCode.ERROR
    assert got["workflow"].status.status_code is StatusCode.ERROR


def test_helpers_make_no_span_when_tracing_is_off(provider: TracerProvider) -> None:
    _EXPORTER.clear()
    assert not tracing.enabled()
    _run([ScriptedWorker("alpha")], lists([0], ["Answer."], [[]]))
    assert tracing.current_traceparent() is None
    assert tracing.workflow_traceparent(uuid.uuid4(), CLIENT_PARENT) is None
    assert _EXPORTER.get_finished_spans() == ()


def test_distributed_spans_share_the_workflow_span_ids(spans: InMemorySpanExporter) -> None:
    """What crosses processes: the aggregator parents a gateway's step on the workflow span's
    preset ids, and writes that span when the workflow ends, with those ids."""
    workflow_id = uuid.uuid4()
    step_parent = tracing.workflow_traceparent(workflow_id, CLIENT_PARENT)
    assert step_parent is not None
    assert CLIENT_TRACE in step_parent
    with tracing.step_span(0, "alpha", step_parent):
        pass
    record = WorkflowRecord(
        workflow_id=workflow_id,
        variant="conductor-ultra",
        question=QUESTION,
        status=WorkflowStatus.COMPLETED,
        planner_calls=[],
        steps=[],
        created_at=tracing_now(-2),
        finished_at=tracing_now(0),
    )
    tracing.record_workflow_span(record, "acme", CLIENT_PARENT)
    got = _by_name(spans.get_finished_spans())
    workflow, step = got["workflow"], got["step 0 alpha"]
    assert _parent_id(step) == workflow.context.span_id
    assert step.context.trace_id == workflow.context.trace_id == int(CLIENT_TRACE, 16)
    assert _parent_id(workflow) == int("b7ad6b7169203331", 16)
    assert workflow.end_time is not None
    assert workflow.start_time is not None
    assert 1.5e9 < workflow.end_time - workflow.start_time < 2.5e9  # its whole run

    # Without a client trace, the trace is the workflow id's (halves swapped).
    spans.clear()
    tracing.record_workflow_span(record, None, None)
    [alone] = spans.get_finished_spans()
    swapped = f"{workflow_id.hex[16:]}{workflow_id.hex[:16]}"
    assert f"{alone.context.trace_id:032x}" == swapped
    assert alone.parent is None


def test_ratio_sampling_keeps_whole_workflows_without_a_client_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ratio sampler keeps about its ratio of workflows that came without a trace, and a
    workflow's steps are kept exactly when its workflow span is (the flag they carry)."""
    sampler = TraceIdRatioBased(0.3)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: TracerProvider(sampler=sampler))
    monkeypatch.setattr(tracing, "_SWITCHES", tracing._Switches(enabled=True))
    kept = 0
    for _ in range(1000):
        workflow_id = uuid.uuid4()
        step_parent = tracing.workflow_traceparent(workflow_id, None)
        assert step_parent is not None
        decision = sampler.should_sample(None, tracing.workflow_trace_id(workflow_id), "w")
        assert step_parent.endswith("-01") == decision.decision.is_sampled()
        kept += step_parent.endswith("-01")
    assert 220 < kept < 380  # 300 expected


def tracing_now(offset_s: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=offset_s)


def test_exporters_come_from_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    assert telemetry.exporters_from_env() == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert telemetry.exporters_from_env() == ["otlp"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert telemetry.exporters_from_env() == []
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    assert telemetry.exporters_from_env() == ["otlp", "console"]
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert telemetry.exporters_from_env() == []
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ConfigurationError, match="unsupported exporter zipkin"):
        telemetry.exporters_from_env()
    assert telemetry.disabled_instrumentations() == {"sqlalchemy", "redis", "aiohttp-client"}
    monkeypatch.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    assert telemetry.disabled_instrumentations() == frozenset()


@pytest.mark.processes
def test_a_process_without_an_exporter_installs_no_provider() -> None:
    """Off by default: no OTEL_* exporter, no provider, no instrumented library, no span."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "from opentelemetry import trace\n"
        "from conductor_adapters import telemetry\n"
        "from conductor import tracing\n"
        "assert telemetry.configure_tracing('api') is False\n"
        "assert not tracing.enabled()\n"
        "span = tracing.TRACER.start_span('x')\n"
        "assert not span.is_recording(), span\n"
        "assert type(trace.get_tracer_provider()).__name__ == 'ProxyTracerProvider'\n"
        "import aiohttp\n"
        "assert not hasattr(aiohttp.ClientSession.__init__, '__wrapped__')\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_log_records_carry_the_trace_and_span_ids(spans: InMemorySpanExporter) -> None:
    from opentelemetry.instrumentation.logging import LoggingInstrumentor

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("conductor.test_tracing")
    logger.addHandler(handler)
    LoggingInstrumentor().instrument(set_logging_format=False, inject_trace_context=True)
    try:
        telemetry.add_trace_ids_to_log_format([handler])
        with tracing.step_span(0, "alpha") as span:
            logger.warning("inside")
        logger.warning("outside")
    finally:
        LoggingInstrumentor().uninstrument()
        logger.removeHandler(handler)
    assert span is not None
    ids = span.get_span_context()
    inside, outside = stream.getvalue().splitlines()
    assert inside == (f"WARNING inside [trace_id={ids.trace_id:032x} span_id={ids.span_id:016x}]")
    assert outside == "WARNING outside [trace_id=0 span_id=0]"
