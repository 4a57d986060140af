"""The benchmarks still run end to end (with tiny numbers: their figures are not checked here,
only that every path they measure answers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.processes]


def test_the_overhead_benchmark_measures_every_embedded_path(tmp_path: Path) -> None:
    # When the benchmark runs against the floor and conductor serve, a few requests per phase
    command = [sys.executable, str(ROOT / "benchmarks" / "orchestration_overhead.py")]
    command += ["--only", "direct,serve", "--sequential", "3", "--requests", "6"]
    command += ["--in-flight", "3", "--burst", "5", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # Then every path and mode was measured, none failed, and the server's CPU was counted
    phases = json.loads((tmp_path / "results.json").read_text())["phases"]
    measured = {(p["path"], p["mode"]) for p in phases}
    for path in ("pass-through", "one-step workflow", "three-step workflow"):
        assert {(f"serve: {path}", "sequential"), (f"serve: {path}", "in-flight")} <= measured
    assert ("serve: one-step workflow, 1 s provider", "burst") in measured
    assert ("direct: 1 s provider", "burst") in measured  # the bursts' floor
    assert all(p["failures"] == 0 for p in phases), phases
    # (CPU is read in 10 ms ticks: a few requests of one phase may show none, all together not)
    assert sum(p["server_cpu_ms_per_request"] for p in phases if p["path"].startswith("serve"))
    assert (tmp_path / "overhead.png").exists()


@pytest.mark.postgres
def test_the_aggregator_benchmark_runs_workflows_to_their_end(postgres_url: str) -> None:
    # When the aggregator's own benchmark runs a few workflows of each length, on the tests'
    # PostgreSQL server (the local one, or the one the tests started)
    command = [sys.executable, str(ROOT / "benchmarks" / "aggregator_messages.py")]
    command += ["--workflows", "3", "--postgres", postgres_url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    # Then it printed both rows (it fails when a workflow did not complete)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for steps in (1, 3):
        assert f"{steps}-step workflow: CPU" in done.stdout


@pytest.mark.model
def test_the_routing_benchmark_times_the_router_against_the_model() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "routing_latency.py")]
    command += ["--questions", "6", "--model-questions", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "router (wordllama-l2-256, 4 workers): p50" in done.stdout
    assert "language-model one-step plan (llamacpp): p50" in done.stdout
    assert "router faster by" in done.stdout


@pytest.mark.training
def test_the_grpo_step_benchmark_times_each_part_of_a_step(tmp_path: Path) -> None:
    from fakes.tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny-model")
    command = [sys.executable, str(ROOT / "benchmarks" / "grpo_step.py")]
    command += ["--questions", "1", "--samples", "2", "--new-tokens", "16", "--steps", "1"]
    # Tiny numbers like the rest: the default 40 warm-up steps took 4-5 min on 2 busy cores.
    command += ["--format-warmup", "2"]
    command += ["--base-model", str(model), "--out", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    steps = json.loads((tmp_path / "run" / "grpo_step.json").read_text())["steps"]
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["generate_s"] > 0  # sampling was timed...
    assert steps[0]["tokens_generated"] > 0
    assert steps[0]["samples_scored"] == 2  # ...and scoring
    assert steps[0]["wall_s"] >= steps[0]["generate_s"] + steps[0]["reward_s"]
