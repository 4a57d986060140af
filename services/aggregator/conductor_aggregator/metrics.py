"""The aggregator's Prometheus metrics, read from the state machine's events after each commit.

A message redelivered after its transaction committed (the process died before the ack) is
applied as a no-op by the machine and emits no event, so it is not counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from conductor.machine import EventKind, MachineEvent
from conductor.workflow import WorkflowRecord
from conductor_adapters.periodic import Periodic

WORKFLOW_SECONDS_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)
STEP_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 240, 600)
PLANNER_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)


class AggregatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.workflows = Counter(
            "conductor_workflows",
            "Workflows that ended, by variant and outcome (completed, failed or cancelled).",
            ["variant", "outcome"],
            registry=self.registry,
        )
        self.workflow_duration = Histogram(
            "conductor_workflow_duration_seconds",
            "From a workflow's creation to its end, by variant and outcome.",
            ["variant", "outcome"],
            buckets=WORKFLOW_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.step_duration = Histogram(
            "conductor_step_duration_seconds",
            "One step's call through the gateway, retries included, by worker and outcome.",
            ["worker", "outcome"],
            buckets=STEP_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.planner_duration = Histogram(
            "conductor_planner_call_duration_seconds",
            "One Conductor call (a planning round) as the aggregator waited for it.",
            buckets=PLANNER_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.plans = Counter(
            "conductor_plans",
            "Conductor calls by whether their plan was valid.",
            ["valid"],
            registry=self.registry,
        )
        self.messages = Counter(
            "conductor_aggregator_messages",
            "Messages handled, by kind (start, plan, step_result) and outcome (ok, retried, "
            "dropped).",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.sweeps = Counter(
            "conductor_sweeper_actions",
            "What the deadline sweeper did: workflows whose deadline passed, workflows "
            "resent after the broker lost its messages, step results recovered (recorded by a "
            "gateway, their message lost).",
            ["action"],
            registry=self.registry,
        )
        self.backlog = Gauge(
            "conductor_queue_backlog",
            "Messages waiting in each queue, read from the broker every few seconds (calls "
            "that a gateway has taken are not in it: see conductor_gateway_calls_in_flight).",
            ["queue"],
            registry=self.registry,
        )

    def record(self, workflow: WorkflowRecord, events: Sequence[MachineEvent]) -> None:
        """Count what one committed change of ``workflow`` did."""
        for event in events:
            if event.kind is EventKind.PLAN:
                call = next((c for c in workflow.planner_calls if c.round == event.round), None)
                if call is not None:
                    self.plans.labels("true" if call.valid else "false").inc()
                    self.planner_duration.observe(call.latency_ms / 1000)
            elif event.kind is EventKind.STEP_FINISHED and event.step is not None:
                step = workflow.steps[event.step]
                self.step_duration.labels(step.worker, step.status.value).observe(
                    step.latency_ms / 1000
                )
            elif event.kind.final:
                outcome = workflow.status.value
                self.workflows.labels(workflow.variant, outcome).inc()
                if workflow.finished_at is not None:
                    seconds = (workflow.finished_at - workflow.created_at).total_seconds()
                    self.workflow_duration.labels(workflow.variant, outcome).observe(seconds)


def backlog_poller(
    read: Callable[[], dict[str, int]], gauge: Gauge, interval_s: float = 5.0
) -> Periodic:
    """A thread that sets ``conductor_queue_backlog`` from ``read`` every ``interval_s``: the
    gateways' queues as the broker counts them, for an autoscaler that reads Prometheus."""

    def poll() -> None:
        for queue, depth in read().items():
            gauge.labels(queue).set(depth)

    return Periodic("conductor-backlog", poll, interval_s, at_start=True)
