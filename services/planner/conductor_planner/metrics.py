"""The planner service's Prometheus metrics, one Plan call at a time.

``gen_ai_server_request_duration_seconds`` is OpenTelemetry's ``gen_ai.server.request.duration``:
the time this model server took to answer one request.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from conductor.workflow import PlanOutcome

PLAN_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.duration = Histogram(
            "gen_ai_server_request_duration_seconds",
            "Time to answer one Plan call, by backend and outcome (ok or error).",
            ["backend", "outcome"],
            buckets=PLAN_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.plans = Counter(
            "conductor_planner_plans",
            "Plans written, by backend and whether they were valid.",
            ["backend", "valid"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "conductor_planner_tokens",
            "Tokens the Conductor read (prompt) and wrote (completion), by backend.",
            ["backend", "kind"],
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "conductor_planner_batch_size",
            "Plans generated together in one batch, by backend (the transformers backend "
            "batches itself; llama.cpp and vLLM batch inside their engines, unseen here).",
            ["backend"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )

    def plan(self, outcome: PlanOutcome, seconds: float) -> None:
        backend = outcome.backend or "unknown"
        self.duration.labels(backend, "ok").observe(seconds)
        self.plans.labels(backend, "true" if outcome.valid else "false").inc()
        self.tokens.labels(backend, "prompt").inc(outcome.usage.prompt_tokens)
        self.tokens.labels(backend, "completion").inc(outcome.usage.completion_tokens)

    def failure(self, backend: str, seconds: float) -> None:
        self.duration.labels(backend, "error").observe(seconds)
