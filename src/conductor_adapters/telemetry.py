"""OpenTelemetry tracing of a process, configured by the standard ``OTEL_*`` variables.

Off unless an exporter is configured: ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``), or an
OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), which
implies ``otlp``. ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` keeps it off.
Off, no tracer provider is installed and no library is instrumented: no span is made.

On, each process exports its spans in batches (``OTEL_BSP_*``) over OTLP (the protocol of
``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``: ``http/protobuf``, the default, or ``grpc``; endpoint,
headers and timeout read by the exporter from the same variables), samples as
``OTEL_TRACES_SAMPLER`` says (default: parent-based, always on), and names itself by
``OTEL_SERVICE_NAME``, else ``conductor-ROLE``. The libraries it speaks through are
instrumented with OpenTelemetry's own instrumentations: gRPC (planner, gRPC door), FastAPI
(the API's requests, honouring a client's ``traceparent``), aiohttp (provider calls; httpx
is only the interface over it), SQLAlchemy and Redis. The last three are off unless
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` is set (the variable lists the ones to leave off;
set empty, every one is on): SQLAlchemy and Redis make a span per statement or command, most
of a trace and a good part of its cost; a provider call's GenAI span is already its client
span, and an HTTP span under it would double what each call costs to trace, so the provider
client sends the ``traceparent`` itself (``conductor.tracing.inject_traceparent``).
Celery's is not used: this system's messages go through a transactional outbox and are sent
later by a relay or a sweeper, where the sending context is not the workflow's; each message
carries its workflow's ``traceparent`` instead (``conductor.tracing``). Log records carry
``trace_id`` and ``span_id``.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from conductor import tracing
from conductor.errors import ConfigurationError

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger(__name__)

EXPORTERS = ("otlp", "console")
INSTRUMENTATIONS = ("aiohttp-client", "grpc", "fastapi", "sqlalchemy", "redis", "logging")
# Left off unless OTEL_PYTHON_DISABLED_INSTRUMENTATIONS says otherwise (see the docstring).
DISABLED_BY_DEFAULT = frozenset({"sqlalchemy", "redis", "aiohttp-client"})
LOG_FORMAT_SUFFIX = " [trace_id=%(otelTraceID)s span_id=%(otelSpanID)s]"
NO_IDS = {"otelTraceID": "0", "otelSpanID": "0"}
ROLE = "conductor.role"  # on every span, and on the resource
# URLs whose requests make no span: probes and scrapes, many per minute, none a request.
EXCLUDED_URLS = "/healthz,/readyz,/livez,/metrics"

_state: dict[str, Any] = {"provider": None, "disabled": frozenset()}


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def exporters_from_env() -> list[str]:
    """The span exporters the environment asks for (empty: tracing is off)."""
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return []
    named = _env("OTEL_TRACES_EXPORTER").lower()
    if not named:
        endpoint = _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    chosen = [name.strip() for name in named.split(",") if name.strip() and name.strip() != "none"]
    unknown = sorted(set(chosen) - set(EXPORTERS))
    if unknown:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER: unsupported exporter {', '.join(unknown)} "
            f"(supported: {', '.join(EXPORTERS)}, none)"
        )
    return chosen


def disabled_instrumentations() -> frozenset[str]:
    if "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS" not in os.environ:
        return DISABLED_BY_DEFAULT
    listed = os.environ["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"].split(",")
    return frozenset(name.strip() for name in listed if name.strip())


def _otlp_exporter() -> Any:
    protocol = (
        _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HTTPSpanExporter,
        )

        return HTTPSpanExporter()
    raise ConfigurationError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol {protocol!r} (grpc, http/protobuf)"
    )


def configure_tracing(role: str) -> bool:
    """Set up this process's tracing from the environment; True when it is on. Called once
    per process, before its servers and clients are made (instrumentation patches them)."""
    if _state["provider"] is not None:
        return True
    exporters = exporters_from_env()
    if not exporters:
        return False
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = new_tracer_provider(role)
    for name in exporters:
        exporter = _otlp_exporter() if name == "otlp" else ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    return True


def new_tracer_provider(role: str) -> TracerProvider:
    """A provider naming this process's role, giving workflow spans their preset ids."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    name = _env("OTEL_SERVICE_NAME") or f"conductor-{role}"
    resource = Resource.create({"service.name": name, "conductor.role": role})
    provider = TracerProvider(resource=resource, id_generator=_preset_id_generator())
    provider.add_span_processor(_role_marker(role))
    return provider


def _role_marker(role: str) -> Any:
    """A processor naming the role on each span: backends that keep a span's attributes but
    not its resource (Arize Phoenix, for one) still show which process wrote it."""
    from opentelemetry.sdk.trace import SpanProcessor

    class RoleMarker(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            span.set_attribute(ROLE, role)

    return RoleMarker()


def _preset_id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class PresetIdGenerator(RandomIdGenerator):
        """Random ids, except for a span whose ids were chosen before it (tracing.PRESET_IDS)."""

        def generate_span_id(self) -> int:
            preset = tracing.PRESET_IDS.get()
            return preset[1] if preset is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            preset = tracing.PRESET_IDS.get()
            if preset is not None and preset[0]:
                return preset[0]
            return super().generate_trace_id()

    return PresetIdGenerator()


def install(provider: TracerProvider) -> None:
    """Make ``provider`` this process's, and instrument the libraries (tests pass one with an
    in-memory exporter)."""
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    _state["provider"] = provider
    _state["disabled"] = disabled_instrumentations()
    capture = _env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT").lower() == "true"
    tracing.set_tracing(enabled=True, capture_content=capture)
    _instrument_libraries(_state["disabled"])


def _instrument_libraries(disabled: frozenset[str]) -> None:
    if "aiohttp-client" not in disabled:
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

        AioHttpClientInstrumentor().instrument()
    if "grpc" not in disabled:
        from opentelemetry.instrumentation.grpc import (
            GrpcAioInstrumentorClient,
            GrpcAioInstrumentorServer,
        )

        GrpcAioInstrumentorServer().instrument()  # type: ignore[no-untyped-call]
        GrpcAioInstrumentorClient().instrument()  # type: ignore[no-untyped-call]
    if "sqlalchemy" not in disabled:
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        # Its declared range stops short of SQLAlchemy 2.1 (sqlmodel's), which it traces all
        # the same; without the skip it logs an error and instruments nothing.
        SQLAlchemyInstrumentor().instrument(skip_dep_check=True)
    if "redis" not in disabled:
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        RedisInstrumentor().instrument()
    if "logging" not in disabled:
        from opentelemetry.instrumentation.logging import LoggingInstrumentor

        LoggingInstrumentor().instrument(set_logging_format=False, inject_trace_context=True)
        add_trace_ids_to_log_format()


def add_trace_ids_to_log_format(handlers: list[logging.Handler] | None = None) -> None:
    """Append the trace and span ids to the format of the root logger's handlers (Celery
    workers call it again once they set up their own)."""
    if not tracing.enabled() or "logging" in _state["disabled"]:
        return
    for handler in handlers if handlers is not None else logging.getLogger().handlers:
        formatter = handler.formatter or logging.Formatter()
        base = formatter._fmt or "%(message)s"
        if LOG_FORMAT_SUFFIX in base:
            continue
        # Defaults: records made without the instrumentation's factory (Celery makes some)
        # would otherwise fail to format.
        handler.setFormatter(
            logging.Formatter(base + LOG_FORMAT_SUFFIX, formatter.datefmt, defaults=NO_IDS)
        )


def instrument_app(app: FastAPI) -> None:
    """Trace the requests of an HTTP app (a no-op when tracing is off): one server span per
    request, child of the client's ``traceparent`` when it sent one."""
    if not tracing.enabled() or "fastapi" in _state["disabled"]:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, excluded_urls=EXCLUDED_URLS, exclude_spans=["receive", "send"]
    )


def shutdown_tracing() -> None:
    """Export what is buffered (a stopping process); nothing when tracing is off."""
    provider = _state["provider"]
    if provider is not None:
        provider.shutdown()
