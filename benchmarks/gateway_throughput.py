"""How many slow provider calls one gateway process holds in flight.

Starts a fake OpenAI-compatible provider (its own process, LATENCY seconds per answer) and one
``conductor gateway`` process, sends CALLS calls through the queue at once, and times them from
the first send to the last reply. Baseline, measured in the same run: the same calls made
in-process through WorkerGateway, with no queue (the ideal is one latency for all of them).

    python benchmarks/gateway_throughput.py [--calls 500] [--latency 1.0] [--broker URL]

Needs Redis (replies; also the default broker) and, for ``--broker amqp://...``, RabbitMQ.
Exits 1 when the queued run misses the target (5 s for 500 calls of 1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import redis.asyncio as aioredis  # noqa: E402

from conductor.chat import ChatMessage  # noqa: E402
from conductor.pool import Pool, load_pool_file  # noqa: E402
from conductor_adapters.queue import new_celery_app  # noqa: E402
from conductor_gateway.client import QueuedStepRunner  # noqa: E402
from conductor_gateway.gateway import WorkerGateway  # noqa: E402
from conductor_gateway.registry import build_workers  # noqa: E402
from conductor_gateway.settings import GatewaySettings  # noqa: E402

from fakes.gateway_bench import gateway_bench  # noqa: E402
from fakes.gateway_process import start_gateway  # noqa: E402

TARGET_S = 5.0
QUEUE = "gateway.openai-compatible"


@dataclass
class Run:
    name: str
    wall_s: float
    latencies_s: list[float]

    def line(self) -> str:
        q = statistics.quantiles(self.latencies_s, n=20)
        count = len(self.latencies_s)
        return (
            f"{self.name:<22} {count} calls in {self.wall_s:5.2f} s ({count / self.wall_s:5.1f}"
            f" calls/s; per call p50 {q[9]:.2f} s, p95 {q[18]:.2f} s)"
        )


def _messages(n: int) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=f"Benchmark call {n}: say ok.")]


async def _all_at_once(name: str, call: Callable[[int], Awaitable[object]], count: int) -> Run:
    latencies: list[float] = []

    async def one(n: int) -> None:
        started = time.perf_counter()
        await call(n)
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*[one(n) for n in range(count)])
    return Run(name, time.perf_counter() - started, latencies)


async def _in_process(pool: Pool, count: int) -> Run:
    gateway = WorkerGateway(pool, build_workers(pool))
    try:
        return await _all_at_once(
            "in-process (baseline)", lambda n: gateway.call("bench", _messages(n)), count
        )
    finally:
        await gateway.aclose()


async def _queued(pool: Pool, settings: GatewaySettings, count: int) -> Run:
    app = new_celery_app("conductor_benchmark_client", settings)
    client = aioredis.from_url(settings.redis_url)
    runner = QueuedStepRunner(app, pool, client, prefix=settings.redis_prefix, reply_timeout_s=120)
    try:
        await runner.call("bench", _messages(-1))  # warm-up: the gateway builds its clients
        return await _all_at_once(
            "one gateway process", lambda n: runner.call("bench", _messages(n)), count
        )
    finally:
        await runner.aclose()
        await client.aclose()
        app.close()


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per provider answer")
    parser.add_argument("--concurrency", type=int, default=500, help="the gateway's threads")
    parser.add_argument("--loglevel", default="INFO", help="the gateway's log level")
    default_redis = os.environ.get("CONDUCTOR_REDIS_URL", "redis://127.0.0.1:6379/0")
    parser.add_argument("--redis", default=default_redis)
    parser.add_argument("--broker", default=os.environ.get("CONDUCTOR_BROKER_URL", default_redis))
    args = parser.parse_args()

    with gateway_bench(args.latency, broker_url=args.broker, redis_url=args.redis) as bench:
        os.environ.update(bench.env)
        pool = load_pool_file(Path(bench.env["CONDUCTOR_POOL_FILE"]))
        baseline = asyncio.run(_in_process(pool, args.calls))
        print(baseline.line())

        gateway = start_gateway(
            bench.env,
            bench.workdir / "gateway.log",
            queues=QUEUE,
            concurrency=args.concurrency,
            loglevel=args.loglevel,
        )
        try:
            assert gateway.process is not None
            cpu_before = _cpu_s(gateway.process.pid)
            sent_at = time.time()
            queued = asyncio.run(_queued(pool, GatewaySettings.load(), args.calls))
            gateway_cpu = _cpu_s(gateway.process.pid) - cpu_before
        finally:
            gateway.stop()
        log = httpx.get(bench.base_url.removesuffix("/v1") + "/_fake/requests").json()
    arrivals = sorted(r["received_at"] - sent_at for r in log["requests"][-args.calls :])
    print(queued.line())
    print(f"{'':<22} provider saw calls {arrivals[0]:.2f}-{arrivals[-1]:.2f} s in")
    print(f"{'':<22} gateway CPU during the calls: {gateway_cpu:.1f} s")
    print(f"{'':<22} queued / in-process wall time: x{queued.wall_s / baseline.wall_s:.2f}")
    verdict = "meets" if queued.wall_s < TARGET_S else "MISSES"
    print(
        f"gateway ({args.broker.partition(':')[0]} broker): {args.calls} calls of "
        f"{args.latency:g} s in {queued.wall_s:.2f} s ({verdict} the {TARGET_S:g} s target)"
    )
    return 0 if queued.wall_s < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
