"""Spans of a workflow, its planning rounds, its steps and their provider calls.

Only the OpenTelemetry API is used here. Until a process configures tracing
(``conductor_adapters.telemetry``, from the standard ``OTEL_*`` variables) every helper returns
at once and no span is made, so an untraced deployment pays nothing.

One workflow is one span, ``workflow``: it holds a span per planning round
(``plan round N``) and per step (``step N WORKER``), and a step's span holds one span per
provider call attempt, named and described by OpenTelemetry's GenAI semantic conventions
(``chat MODEL``: ``gen_ai.*`` attributes). The embedded runtime keeps the workflow's span open
while it runs. The distributed runtime cannot: its workflow moves between processes with
every message. There, the workflow's span gets ids derived from the workflow (its trace: the
client's, else one made of the workflow id; its span id: the workflow id's low 64 bits), every
process parents its spans on those ids, and the aggregator that ends the workflow writes the
span itself, dated from its start (``record_workflow_span``).

Prompts and answers are recorded only when the operator turns capture on (the conventions'
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``); API keys never are.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from conductor.chat import ChatMessage, Completion
    from conductor.pool import WorkerSpec
    from conductor.workflow import WorkflowRecord

TRACER = trace.get_tracer("conductor")  # a proxy: it uses the provider configured later
_PROPAGATOR = TraceContextTextMapPropagator()

WORKFLOW_ID = "conductor.workflow.id"
VARIANT = "conductor.variant"
TENANT = "conductor.tenant"
STATUS = "conductor.workflow.status"
COST = "conductor.cost_usd"
ROUND = "conductor.round"
STEP = "conductor.step"
WORKER = "conductor.worker"
QUOTA_WAIT_MS = "conductor.quota_wait_ms"

# gen_ai.provider.name per pool provider: the conventions' names where one exists.
GENAI_PROVIDERS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "openai-compatible": "openai-compatible",
    "llamacpp": "llama.cpp",
    "sim": "conductor.sim",
    "replay": "conductor.replay",
}


@dataclass
class _Switches:
    enabled: bool = False
    capture_content: bool = False


_SWITCHES = _Switches()

# Ids the next span must take (trace id, or 0 for its parent's; span id): read by the id
# generator that ``conductor_adapters.telemetry`` installs, so that a workflow's span, written
# last, has the ids its children were given from the start.
PRESET_IDS: ContextVar[tuple[int, int] | None] = ContextVar("conductor_preset_ids", default=None)


def set_tracing(*, enabled: bool, capture_content: bool = False) -> None:
    """Turn the helpers on (a tracer provider is configured) or off."""
    _SWITCHES.enabled = enabled
    _SWITCHES.capture_content = capture_content


def enabled() -> bool:
    return _SWITCHES.enabled


# -- context across processes ------------------------------------------------------------------


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, to carry in a message; None when off."""
    if not _SWITCHES.enabled:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def inject_traceparent(headers: list[tuple[str, str]]) -> None:
    """Add the current span's ``traceparent`` to an outgoing request's headers (a provider
    call's: the provider's own spans then join the trace, under its GenAI span)."""
    if not _SWITCHES.enabled:
        return
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    headers.extend(carrier.items())


def _parent(traceparent: str | None) -> SpanContext | None:
    if not traceparent:
        return None
    span_context = trace.get_current_span(
        _PROPAGATOR.extract({"traceparent": traceparent})
    ).get_span_context()
    return span_context if span_context.is_valid else None


def context_of(traceparent: str | None) -> otel_context.Context | None:
    """The context whose current span is the one ``traceparent`` names (None: no parent)."""
    parent = _parent(traceparent)
    return None if parent is None else trace.set_span_in_context(NonRecordingSpan(parent))


def workflow_trace_id(workflow_id: uuid.UUID) -> int:
    """The trace of a workflow that came without one: its id, halves swapped. Ratio samplers
    read a trace id's low 64 bits, and a UUID4's low half starts with its fixed variant bits
    (always above half the range); its high half starts with random bits."""
    value = workflow_id.int
    return ((value & 0xFFFF_FFFF_FFFF_FFFF) << 64) | (value >> 64)


def _sampled_as_root(trace_id: int) -> bool:
    """Whether the process's sampler keeps a trace started with this id (a workflow without a
    client trace): decided once, carried by every span of the workflow in every process."""
    sampler = getattr(trace.get_tracer_provider(), "sampler", None)
    if sampler is None:
        return True
    result = sampler.should_sample(None, trace_id, "workflow")
    return bool(result.decision.is_sampled())


def workflow_span_context(workflow_id: uuid.UUID, traceparent: str | None) -> SpanContext:
    """The ids of a distributed workflow's span: in its client's trace when it came with one
    (else ``workflow_trace_id``), its span id the workflow id's low 64 bits."""
    parent = _parent(traceparent)
    if parent is not None:
        trace_id, flags = parent.trace_id, parent.trace_flags
    else:
        trace_id = workflow_trace_id(workflow_id)
        sampled = _sampled_as_root(trace_id)
        flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    span_id = (workflow_id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)


def workflow_traceparent(workflow_id: uuid.UUID, traceparent: str | None) -> str | None:
    """The ``traceparent`` that parents a distributed workflow's spans on its workflow span."""
    if not _SWITCHES.enabled:
        return None
    carrier: dict[str, str] = {}
    span = NonRecordingSpan(workflow_span_context(workflow_id, traceparent))
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


# -- spans --------------------------------------------------------------------------------------


def _ns(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1e9)


def _workflow_attributes(
    workflow_id: uuid.UUID, variant: str, tenant: str | None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {WORKFLOW_ID: str(workflow_id), VARIANT: variant}
    if tenant is not None:
        attributes[TENANT] = tenant
    return attributes


def end_workflow(span: Span, record: WorkflowRecord) -> None:
    """What a workflow's span says of its outcome."""
    span.set_attribute(STATUS, record.status.value)
    span.set_attribute(COST, record.cost_usd)
    span.set_attribute("gen_ai.usage.input_tokens", record.usage.prompt_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", record.usage.completion_tokens)
    if record.status.value != "completed":
        span.set_status(Status(StatusCode.ERROR, record.error or record.status.value))
        span.set_attribute("error.type", record.status.value)


@contextmanager
def workflow_span(
    workflow_id: uuid.UUID, variant: str, tenant: str | None, traceparent: str | None = None
) -> Iterator[Span | None]:
    """The embedded runtime's workflow span, current while it runs (None: tracing is off).
    ``traceparent``: its parent when the workflow is not run under its request's span."""
    if not _SWITCHES.enabled:
        yield None
        return
    parent = context_of(traceparent)
    with TRACER.start_as_current_span(
        "workflow",
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes=_workflow_attributes(workflow_id, variant, tenant),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def record_workflow_span(
    record: WorkflowRecord, tenant: str | None, traceparent: str | None
) -> None:
    """Write a distributed workflow's span once it ended, with the ids its children used."""
    if not _SWITCHES.enabled:
        return
    ids = workflow_span_context(record.workflow_id, traceparent)
    parent = context_of(traceparent)
    token = PRESET_IDS.set((0 if parent is not None else ids.trace_id, ids.span_id))
    try:
        span = TRACER.start_span(
            "workflow",
            context=parent if parent is not None else otel_context.Context(),
            kind=SpanKind.INTERNAL,
            attributes=_workflow_attributes(record.workflow_id, record.variant, tenant),
            start_time=_ns(record.created_at),
        )
    finally:
        PRESET_IDS.reset(token)
    end_workflow(span, record)
    span.end(end_time=_ns(record.finished_at))


@contextmanager
def _current_span(
    name: str, traceparent: str | None, attributes: dict[str, Any]
) -> Iterator[Span | None]:
    """A span current while it lasts, under ``traceparent``'s (else the current one); None
    when tracing is off."""
    if not _SWITCHES.enabled:
        yield None
        return
    with TRACER.start_as_current_span(
        name, context=context_of(traceparent), attributes=attributes
    ) as span:
        yield span


def planning_span(
    round_no: int, traceparent: str | None = None
) -> AbstractContextManager[Span | None]:
    """A planning round: the Conductor's call. ``traceparent``: its workflow's (distributed)."""
    return _current_span(f"plan round {round_no}", traceparent, {ROUND: round_no})


def step_span(
    step: int, worker: str, traceparent: str | None = None
) -> AbstractContextManager[Span | None]:
    """One workflow step, around its worker call and retries (``traceparent``: distributed)."""
    return _current_span(f"step {step} {worker}", traceparent, {STEP: step, WORKER: worker})


def end_step(span: Span | None, cost_usd: float | None, error: str | None) -> None:
    """What a step's span says of its outcome: its cost, or that it failed (the error's
    class: the recorded reason can quote a provider's answer)."""
    if span is None:
        return
    if cost_usd is not None:
        span.set_attribute(COST, cost_usd)
    if error is not None:
        kind = error.partition(":")[0]
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, kind))


def call_span(traceparent: str | None, worker: str) -> AbstractContextManager[Span | None]:
    """A pass-through call of one worker through a gateway, under its request's span."""
    return _current_span(f"call {worker}", traceparent, {WORKER: worker})


def add_event(name: str, attributes: dict[str, Any]) -> None:
    """An event on the current span (a retry, say); nothing when tracing is off."""
    if _SWITCHES.enabled:
        trace.get_current_span().add_event(name, attributes)


@contextmanager
def provider_call_span(
    spec: WorkerSpec,
    messages: Sequence[ChatMessage],
    *,
    max_tokens: int,
    temperature: float,
    attempt: int,
) -> Iterator[Span | None]:
    """One provider call attempt of a worker."""
    provider = GENAI_PROVIDERS.get(spec.provider.value, spec.provider.value)
    extra = {WORKER: spec.name, "conductor.attempt": attempt}
    with model_call_span(provider, spec.model, messages, max_tokens, temperature, extra) as span:
        yield span


@contextmanager
def model_call_span(
    provider: str,
    model: str,
    messages: Sequence[ChatMessage],
    max_tokens: int,
    temperature: float,
    extra: dict[str, Any] | None = None,
) -> Iterator[Span | None]:
    """One inference call, as the GenAI conventions describe it (a worker's, the Conductor's)."""
    if not _SWITCHES.enabled:
        yield None
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.request.temperature": temperature,
        **(extra or {}),
    }
    if _SWITCHES.capture_content:
        attributes["gen_ai.input.messages"] = json.dumps(
            [{"role": m.role, "parts": [{"type": "text", "content": m.content}]} for m in messages]
        )
    with TRACER.start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_provider_call(
    span: Span | None,
    completion: Completion | None,
    error: BaseException | None = None,
    *,
    cost_usd: float | None = None,
) -> None:
    """What a provider call span says of its answer (and its price) or its failure."""
    if span is None:
        return
    if cost_usd is not None:
        span.set_attribute(COST, cost_usd)
    if completion is not None:
        if completion.model:
            span.set_attribute("gen_ai.response.model", completion.model)
        span.set_attribute("gen_ai.usage.input_tokens", completion.usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", completion.usage.completion_tokens)
        if completion.finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [completion.finish_reason])
        if _SWITCHES.capture_content:
            output = [{"type": "text", "content": completion.text}]
            span.set_attribute(
                "gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": output}])
            )
    if error is not None:
        span.set_attribute("error.type", type(error).__name__)
        status_code = getattr(error, "status_code", None)
        if isinstance(status_code, int):
            span.set_attribute("http.response.status_code", status_code)
        # The class only: a provider's message can quote the request back.
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
