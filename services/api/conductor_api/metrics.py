"""Prometheus metrics of one API process, in a registry of its own (one per app)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


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

    async def middleware(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        self.requests.labels(request.method, route, str(response.status_code)).inc()
        self.latency.labels(request.method, route).observe(time.perf_counter() - started)
        return response

    def exposition(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
