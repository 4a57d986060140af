"""The metric list the manifests are checked against is the one the roles' code registers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from prometheus_client.metrics import MetricWrapperBase

from conductor_aggregator.metrics import AggregatorMetrics
from conductor_api.metrics import ApiMetrics
from conductor_gateway.metrics import GatewayMetrics
from conductor_planner.metrics import PlannerMetrics

VALIDATOR = Path(__file__).resolve().parents[2] / "infra" / "k8s" / "validate_manifests.py"


def _validator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_manifests", VALIDATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _registered() -> dict[str, tuple[str, frozenset[str]]]:
    """Every metric the four roles register: exposed name, kind, label names."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for metrics in (GatewayMetrics(), AggregatorMetrics(), PlannerMetrics(), ApiMetrics()):
        for metric in vars(metrics).values():
            if isinstance(metric, MetricWrapperBase):
                kind = metric._type
                name = metric._name + ("_total" if kind == "counter" else "")
                found[name] = (kind, frozenset(metric._labelnames))
    return found


def test_the_manifests_checker_knows_exactly_the_metrics_the_roles_export() -> None:
    assert _registered() == _validator().METRICS
