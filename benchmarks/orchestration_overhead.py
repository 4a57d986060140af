"""What orchestrating costs on top of the provider: `conductor serve` against fake upstreams.

A fake OpenAI-compatible provider that answers at once, another that answers in one second, and
a fake Conductor (its plans: N chained steps on Model 0, N named in the question) each run in a
process of their own, and so does `conductor serve` (embedded runtime, SQLite). Requests come
from one asyncio client (httpx) in this process:

- direct: straight to the instant provider (the floor);
- pass-through: Chat Completions with a worker as the model;
- one-step and three-step workflows: Chat Completions with the variant as the model.

Each path is measured sequentially (latency p50/p95/p99) and with 50 requests in flight
(throughput), and the server's CPU (user + system, read from /proc) is divided by the requests
it served. Then 500 one-step workflows and 500 pass-through calls on the one-second provider are
sent all at once: the wall time, against the one second a provider would take.

    python benchmarks/orchestration_overhead.py [--sequential 200] [--requests 500]
        [--in-flight 50] [--burst 500] [--out out/orchestration]

Prints a table; writes ``results.json`` and, with matplotlib, ``overhead.png`` under --out.
Not measured here yet: the distributed runtime and LiteLLM's proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
import yaml  # noqa: E402

from conductor_adapters.http_wire import ShardedTransport  # noqa: E402
from conductor_cli.local_stack import ServiceProcess  # noqa: E402

from fakes.api_process import announced_addresses, start_api_role  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
QUESTION = "What is 6 * 7?"


@dataclass
class Phase:
    path: str
    mode: str  # sequential | in-flight | burst
    requests: int
    concurrency: int
    wall_s: float
    latencies_ms: list[float] = field(repr=False)
    server_cpu_ms_per_request: float
    failures: int

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    def percentile(self, q: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else float("nan")
        return statistics.quantiles(self.latencies_ms, n=100)[q - 1]

    def summary(self) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k != "latencies_ms"}
        row |= {
            "p50_ms": round(self.percentile(50), 2),
            "p95_ms": round(self.percentile(95), 2),
            "p99_ms": round(self.percentile(99), 2),
            "per_second": round(self.throughput, 1),
        }
        return row


class FakeUpstream:
    """``python -m fakes.serve openai`` in its own process; its base URL once it listens."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fakes.serve", "openai", *args],
            cwd=ROOT / "tests",
            env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError(f"fake upstream {args} did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def server_cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process has used (fields 14 and 15 of its stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start_serve(
    directory: Path, instant: FakeUpstream, slow: FakeUpstream, planner: FakeUpstream
) -> tuple[ServiceProcess, str]:
    pool = {
        "workers": {
            name: {
                "provider": "openai-compatible",
                "model": name,
                "base_url": upstream.base_url,
                "price": {"input": 1.0, "output": 2.0},
                "max_tokens": 16,
            }
            for name, upstream in (("fast", instant), ("slow", slow))
        }
    }
    pool_file = directory / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(pool, sort_keys=False))
    env = {
        "CONDUCTOR_DATABASE_URL": f"sqlite:///{directory / 'conductor.db'}",
        "CONDUCTOR_POOL_FILE": str(pool_file),
        "CONDUCTOR_PLANNER_BACKEND": "openai",
        "CONDUCTOR_PLANNER_BASE_URL": planner.base_url,
        "CONDUCTOR_PLANNER_MODEL": "fake-conductor",
    }
    serve = start_api_role("serve", directory / "serve.log", env)
    url, _ = announced_addresses(serve)
    return serve, url


def chat_body(model: str, question: str, pool: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": question}]}
    if pool is not None:
        body["conductor"] = {"pool": pool}
    return body


async def measure(
    client: httpx.AsyncClient,
    path: str,
    mode: str,
    url: str,
    body: dict[str, Any],
    *,
    requests: int,
    concurrency: int,
    server_pid: int | None,
) -> Phase:
    latencies: list[float] = []
    failures = 0
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        nonlocal failures
        async with gate:
            started = time.perf_counter()
            response = await client.post(url, json=body)
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                failures += 1

    cpu_before = server_cpu_s(server_pid) if server_pid else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    wall = time.perf_counter() - started
    cpu = (server_cpu_s(server_pid) - cpu_before) if server_pid else 0.0
    return Phase(
        path=path,
        mode=mode,
        requests=requests,
        concurrency=concurrency,
        wall_s=round(wall, 3),
        latencies_ms=latencies,
        server_cpu_ms_per_request=round(cpu * 1000 / requests, 2),
        failures=failures,
    )


async def run(
    options: argparse.Namespace, serve_url: str, direct_url: str, pid: int
) -> list[Phase]:
    completions = f"{serve_url}/v1/chat/completions"
    paths: list[tuple[str, str, dict[str, Any], int | None]] = [
        ("direct", f"{direct_url}/chat/completions", chat_body("fast", QUESTION), None),
        ("pass-through", completions, chat_body("fast", QUESTION), pid),
        (
            "one-step workflow",
            completions,
            chat_body("conductor-ultra", f"[1 steps] {QUESTION}", ["fast"]),
            pid,
        ),
        (
            "three-step workflow",
            completions,
            chat_body("conductor-ultra", f"[3 steps] {QUESTION}", ["fast"]),
            pid,
        ),
    ]
    slow_paths = [
        ("pass-through, 1 s provider", chat_body("slow", QUESTION)),
        (
            "one-step workflow, 1 s provider",
            chat_body("conductor-ultra", f"[1 steps] {QUESTION}", ["slow"]),
        ),
    ]
    # (path, mode, url, body, requests, concurrency, server pid), in the order they run
    runs = [
        (name, mode, url, body, requests, concurrency, server_pid)
        for name, url, body, server_pid in paths
        for mode, requests, concurrency in (
            ("sequential", options.sequential, 1),
            ("in-flight", options.requests, options.in_flight),
        )
    ] + [
        (name, "burst", completions, body, options.burst, options.burst, pid)
        for name, body in slow_paths
    ]
    phases: list[Phase] = []
    warmed: set[str] = set()
    # The client spreads its connections over many pools, as the server's gateway does: with
    # one httpcore pool, the client spent 6 s of CPU on 500 calls in flight and was what
    # limited the bursts, not the server.
    async with httpx.AsyncClient(timeout=600, transport=ShardedTransport(32)) as client:
        for name, mode, url, body, requests, concurrency, server_pid in runs:
            if name not in warmed and mode != "burst":
                for _ in range(5):  # warm-up: connections, caches, the first plan
                    await client.post(url, json=body)
                warmed.add(name)
            phase = await measure(
                client,
                name,
                mode,
                url,
                body,
                requests=requests,
                concurrency=concurrency,
                server_pid=server_pid,
            )
            report(phase)
            phases.append(phase)
    return phases


def report(phase: Phase) -> None:
    row = phase.summary()
    print(
        f"{phase.path:32} {phase.mode:10} n={phase.requests:<4} c={phase.concurrency:<4} "
        f"p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f}  p99 {row['p99_ms']:8.2f}  "
        f"{row['per_second']:7.1f}/s  wall {phase.wall_s:6.2f} s  "
        f"server CPU {phase.server_cpu_ms_per_request:6.2f} ms/req  failures {phase.failures}",
        flush=True,
    )


def write_chart(phases: list[Phase], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sequential = [p for p in phases if p.mode == "sequential"]
    loaded = [p for p in phases if p.mode == "in-flight"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    names = [p.path for p in sequential]
    left.barh(names, [p.percentile(50) for p in sequential])
    left.set_xlabel("sequential p50 latency (ms)")
    right.barh([p.path for p in loaded], [p.throughput for p in loaded])
    right.set_xlabel(f"requests per second, {loaded[0].concurrency} in flight")
    for axis in (left, right):
        axis.invert_yaxis()
        axis.grid(True, axis="x", alpha=0.3)
    chart = out / "overhead.png"
    fig.savefig(chart, dpi=120)
    plt.close(fig)
    return chart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=200, help="requests one at a time")
    parser.add_argument("--requests", type=int, default=500, help="requests of the loaded runs")
    parser.add_argument("--in-flight", type=int, default=50, help="concurrency of those")
    parser.add_argument("--burst", type=int, default=500, help="1-s calls sent all at once")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "orchestration")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)

    upstreams: list[FakeUpstream] = []
    stops: list[Callable[[], None]] = []
    try:
        instant = FakeUpstream()
        slow = FakeUpstream("--latency", "1")
        planner = FakeUpstream("--responder", "plans")
        upstreams += [instant, slow, planner]
        with tempfile.TemporaryDirectory(prefix="conductor-overhead-") as tmp:
            serve, url = start_serve(Path(tmp), instant, slow, planner)
            stops.append(serve.stop)
            assert serve.process is not None
            print(f"conductor serve at {url} (pid {serve.process.pid}); {os.cpu_count()} CPUs")
            phases = asyncio.run(run(options, url, instant.base_url, serve.process.pid))
            serve.stop()
            stops.clear()
    finally:
        for stop in stops:
            stop()
        for upstream in upstreams:
            upstream.stop()

    results = {
        "cpus": os.cpu_count(),
        "options": {k: str(v) for k, v in vars(options).items()},
        "phases": [p.summary() for p in phases],
    }
    (options.out / "results.json").write_text(json.dumps(results, indent=2))
    chart = write_chart(phases, options.out)
    print(f"wrote {options.out / 'results.json'}" + (f" and {chart}" if chart else ""))


if __name__ == "__main__":
    main()
