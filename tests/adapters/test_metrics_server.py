"""A role's metrics port: the registry's exposition, and the two probes Kubernetes reads."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from conductor_adapters.metrics_server import MetricsServer, start_metrics_server


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("conductor_probe_things", "Things.", ["kind"], registry=registry).labels("a").inc(3)
    return registry


@pytest.fixture
def ready_state() -> dict[str, object]:
    return {"ready": True}


@pytest.fixture
def server(registry: CollectorRegistry, ready_state: dict[str, object]) -> Iterator[MetricsServer]:
    def ready() -> bool:
        state = ready_state["ready"]
        if isinstance(state, Exception):
            raise state
        return bool(state)

    server = MetricsServer(registry, port=0, host="127.0.0.1", ready=ready).start()
    yield server
    server.stop()


def test_metrics_are_the_registrys_exposition(server: MetricsServer) -> None:
    response = httpx.get(f"http://127.0.0.1:{server.port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert 'conductor_probe_things_total{kind="a"} 3.0' in response.text


def test_readiness_follows_its_check_and_liveness_does_not(
    server: MetricsServer, ready_state: dict[str, object]
) -> None:
    base = f"http://127.0.0.1:{server.port}"
    assert httpx.get(f"{base}/readyz").status_code == 200
    ready_state["ready"] = False
    assert httpx.get(f"{base}/readyz").status_code == 503
    # A check that raises has failed; its message stays in the log, not in the answer
    ready_state["ready"] = ConnectionError("redis://user:secret@10.0.0.5:6379 refused")
    refused = httpx.get(f"{base}/readyz")
    assert refused.status_code == 503
    assert "secret" not in refused.text
    # Liveness never asks the dependencies: a restart would not bring Redis back
    assert httpx.get(f"{base}/healthz").status_code == 200


def test_other_paths_are_not_found(server: MetricsServer) -> None:
    response = httpx.get(f"http://127.0.0.1:{server.port}/")
    assert response.status_code == 404
    assert "/metrics" in response.text


def test_no_port_means_no_server(registry: CollectorRegistry) -> None:
    assert start_metrics_server(registry, None) is None
