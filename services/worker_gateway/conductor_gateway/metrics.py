"""The gateway's Prometheus metrics: one provider call at a time, per worker.

Names follow OpenTelemetry's GenAI semantic conventions where one fits
(``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage``, with their attribute names
as labels); the rest are ``conductor_gateway_*``. A call here is one attempt: retries and
fallbacks each count as a call of their own, as each is a request the vendor bills and limits.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from conductor.messaging import queue_for
from conductor.pool import WorkerSpec
from conductor.workflow import AttemptRecord

# Provider calls run from a fraction of a second to the step deadline (600 s by default).
CALL_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 240, 600)
QUOTA_WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# OpenTelemetry's recommended boundaries for gen_ai.client.token.usage.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Duration of one provider call (one attempt), by worker and outcome.",
            ["worker", "gen_ai_provider_name", "gen_ai_request_model", "outcome"],
            buckets=CALL_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens of one successful provider call, by kind (input or output).",
            ["worker", "gen_ai_provider_name", "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.calls = Counter(
            "conductor_gateway_calls",
            "Provider calls (attempts) by worker, queue, outcome (ok or the error class) and "
            "HTTP status (empty when the provider sent none).",
            ["worker", "queue", "outcome", "status"],
            registry=self.registry,
        )
        self.cost = Counter(
            "conductor_gateway_cost_usd",
            "What the calls cost, in US dollars, by worker (failed calls that billed included).",
            ["worker"],
            registry=self.registry,
        )
        self.retries = Counter(
            "conductor_gateway_retries",
            "Calls made again after a retryable failure, by worker.",
            ["worker"],
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "conductor_gateway_fallbacks",
            "Steps handed to a fallback worker, by the fallback that took them.",
            ["worker"],
            registry=self.registry,
        )
        self.quota_wait = Histogram(
            "conductor_gateway_quota_wait_seconds",
            "Time a call waited for its worker's quotas (RPM, TPM, concurrency) before it ran.",
            ["worker"],
            buckets=QUOTA_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "conductor_gateway_calls_in_flight",
            "Steps this process holds (waiting for quota, being called or retried), by queue. "
            "With the queue's backlog, what an autoscaler should count: prefetched messages "
            "are no longer in the queue.",
            ["queue"],
            registry=self.registry,
        )

    def attempt(self, spec: WorkerSpec, record: AttemptRecord) -> None:
        """One provider call, as the gateway recorded it."""
        provider = spec.provider.value
        outcome = "ok" if record.status == "ok" else (record.error_class or "error")
        status = "" if record.status_code is None else str(record.status_code)
        self.duration.labels(spec.name, provider, spec.model, outcome).observe(
            record.latency_ms / 1000
        )
        self.calls.labels(spec.name, queue_for(spec), outcome, status).inc()
        self.quota_wait.labels(spec.name).observe(record.quota_wait_ms / 1000)
        if record.cost_usd:
            self.cost.labels(spec.name).inc(record.cost_usd)
        if record.status == "ok":
            self.tokens.labels(spec.name, provider, "input").observe(record.usage.prompt_tokens)
            self.tokens.labels(spec.name, provider, "output").observe(
                record.usage.completion_tokens
            )

    def retry(self, spec: WorkerSpec) -> None:
        self.retries.labels(spec.name).inc()

    def fallback(self, spec: WorkerSpec) -> None:
        self.fallbacks.labels(spec.name).inc()
