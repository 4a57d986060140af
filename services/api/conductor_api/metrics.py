"""Prometheus metrics of one API process, in a registry of its own (one per app)."""

from __future__ import annotations

import time

from fastapi import Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conductor_api.schemas import WorkflowView


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "conductor_http_requests",
            "HTTP requests answered, by route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "conductor_http_request_duration_seconds",
            "Time to answer (to the first byte for streams), by route template.",
            ["method", "route"],
            registry=self.registry,
        )
        self.workflows = Counter(
            "conductor_workflows_submitted",
            "Workflows accepted, by variant.",
            ["variant"],
            registry=self.registry,
        )
        self.passthrough = Counter(
            "conductor_passthrough_calls",
            "Single-worker (pass-through) chat completions, by worker and outcome.",
            ["worker", "outcome"],
            registry=self.registry,
        )

        self.workflows_ended = Counter(
            "conductor_api_workflows",
            "Workflows whose answer the API waited for (chat completions), by variant and "
            "outcome; every workflow, jobs included, is counted by conductor_workflows_total.",
            ["variant", "outcome"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "conductor_api_tokens",
            "Tokens of the workflows the API waited for (Conductor and workers), by tenant, "
            "variant and kind (prompt or completion).",
            ["tenant", "variant", "kind"],
            registry=self.registry,
        )
        self.cost = Counter(
            "conductor_api_cost_usd",
            "What those workflows cost, in US dollars, by tenant and variant.",
            ["tenant", "variant"],
            registry=self.registry,
        )

        self.budget_remaining = Gauge(
            "conductor_api_key_budget_remaining_usd",
            "What an API key with a budget may still spend this period, as its last request "
            "saw it, by key id.",
            ["key_id"],
            registry=self.registry,
        )
        self.refused = Counter(
            "conductor_api_key_limit_refusals",
            "Requests refused (429) at an API key's limit, by reason (the error code).",
            ["reason"],
            registry=self.registry,
        )

    def workflow(self, tenant: str, view: WorkflowView) -> None:
        """A workflow the API waited for has ended (or was found ended)."""
        self.workflows_ended.labels(view.variant, view.status).inc()
        self.tokens.labels(tenant, view.variant, "prompt").inc(view.usage.prompt_tokens)
        self.tokens.labels(tenant, view.variant, "completion").inc(view.usage.completion_tokens)
        self.cost.labels(tenant, view.variant).inc(view.cost_usd)

    def record(self, scope: Scope, status: int, started: float) -> None:
        """One HTTP request answered with ``status``, begun at ``started`` (perf_counter)."""
        route = getattr(scope.get("route"), "path", "unmatched")
        self.requests.labels(scope["method"], route, str(status)).inc()
        self.latency.labels(scope["method"], route).observe(time.perf_counter() - started)

    def exposition(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Counts and times every HTTP request (to its first byte), as plain ASGI: Starlette's
    BaseHTTPMiddleware runs each request in a task of its own with memory streams, a cost
    paid on every request."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answered = False

        async def timed(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
                self.metrics.record(scope, message["status"], started)
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            if not answered:  # failed before answering: the server answers 500
                self.metrics.record(scope, 500, started)
