"""What an autoscaler sees of a gateway queue under load: the backlog plus the calls in flight.

Starts a fake OpenAI-compatible provider (LATENCY seconds per answer) and one ``conductor
gateway`` process running CONCURRENCY calls at once with its metrics port open, sends CALLS
calls at once, and every 0.25 s reads (a) the queue's backlog from the broker, as the
aggregator exports it in ``conductor_queue_backlog``, and (b) the gateway's
``conductor_gateway_calls_in_flight``. The truth, measured in the same run, is the number of
calls sent to the broker and not answered yet. The sum the KEDA triggers use (backlog + in
flight) should follow it; the backlog alone (what a scaler that reads only the queue sees)
misses the calls a gateway has taken.

    python benchmarks/gateway_backlog.py [--calls 60] [--concurrency 8] [--latency 1.0]
                                         [--broker redis://...|amqp://...]

Needs Redis (replies; also the default broker) and, for ``--broker amqp://...``, RabbitMQ.
The three figures are read one after the other, not at one instant: between two reads up to
CONCURRENCY calls can end and as many be taken. Exits 1 when backlog + in flight ever differs
from the truth by more than that (twice the concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import redis.asyncio as aioredis  # noqa: E402

from conductor.chat import ChatMessage  # noqa: E402
from conductor.pool import load_pool_file  # noqa: E402
from conductor_adapters.queue import new_celery_app, queue_depths  # noqa: E402
from conductor_cli.local_stack import free_port  # noqa: E402
from conductor_gateway.client import QueuedStepRunner  # noqa: E402
from conductor_gateway.settings import GatewaySettings  # noqa: E402

from fakes.gateway_bench import gateway_bench  # noqa: E402
from fakes.gateway_process import start_gateway  # noqa: E402
from fakes.metrics import samples  # noqa: E402

QUEUE = "gateway.openai-compatible"
SAMPLE_S = 0.25


def _in_flight(metrics_url: str) -> float:
    scraped = samples(httpx.get(f"{metrics_url}/metrics", timeout=5).text)
    return scraped.get(("conductor_gateway_calls_in_flight", (("queue", QUEUE),)), 0.0)


async def _load(calls: int, metrics_url: str) -> list[tuple[float, int, int, float]]:
    """(seconds since sending, outstanding calls, backlog, in flight) every SAMPLE_S."""
    settings = GatewaySettings.load()
    pool = load_pool_file(Path(os.environ["CONDUCTOR_POOL_FILE"]))
    app = new_celery_app("conductor_benchmark_client", settings)
    # The truth counts a call from the moment the broker has it: sends are counted as they
    # return (the runner publishes from threads, so a call can be made but not yet sent).
    published = [0]
    send_task = app.send_task

    def counted_send(*args: Any, **kwargs: Any) -> Any:
        sent = send_task(*args, **kwargs)
        published[0] += 1
        return sent

    app.send_task = counted_send  # type: ignore[method-assign]
    client = aioredis.from_url(settings.redis_url)
    runner = QueuedStepRunner(app, pool, client, prefix=settings.redis_prefix, reply_timeout_s=300)
    samples: list[tuple[float, int, int, float]] = []
    try:
        await runner.call("bench", [ChatMessage(role="user", content="warm-up")])
        published[0] = 0
        started = time.perf_counter()
        tasks = [
            asyncio.create_task(
                runner.call("bench", [ChatMessage(role="user", content=f"call {n}")])
            )
            for n in range(calls)
        ]
        while True:
            outstanding = published[0] - sum(task.done() for task in tasks)
            backlog = (await asyncio.to_thread(queue_depths, app, [QUEUE]))[QUEUE]
            in_flight = await asyncio.to_thread(_in_flight, metrics_url)
            samples.append((time.perf_counter() - started, outstanding, backlog, in_flight))
            if all(task.done() for task in tasks):
                break
            await asyncio.sleep(SAMPLE_S)
        await asyncio.gather(*tasks)
        return samples
    finally:
        await runner.aclose()
        await client.aclose()
        app.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per provider answer")
    default_redis = os.environ.get("CONDUCTOR_REDIS_URL", "redis://127.0.0.1:6379/0")
    parser.add_argument("--redis", default=default_redis)
    parser.add_argument("--broker", default=os.environ.get("CONDUCTOR_BROKER_URL", default_redis))
    args = parser.parse_args()

    with gateway_bench(args.latency, broker_url=args.broker, redis_url=args.redis) as bench:
        port = free_port()
        env = {**bench.env, "CONDUCTOR_METRICS_PORT": str(port)}
        os.environ.update(env)
        gateway = start_gateway(
            env, bench.workdir / "gateway.log", queues=QUEUE, concurrency=args.concurrency
        )
        try:
            samples = asyncio.run(_load(args.calls, f"http://127.0.0.1:{port}"))
        finally:
            gateway.stop()

    broker = args.broker.partition(":")[0]
    print(
        f"{args.calls} calls of {args.latency:g} s, gateway concurrency {args.concurrency}, "
        f"{broker} broker"
    )
    print("   t (s)  outstanding  backlog  in flight  backlog+in flight")
    gaps = []
    for at, outstanding, backlog, in_flight in samples:
        seen = backlog + in_flight
        gaps.append(abs(seen - outstanding))
        print(f"{at:8.2f}  {outstanding:11d}  {backlog:7d}  {in_flight:9.0f}  {seen:17.0f}")
    worst = max(gaps)
    exact = sum(gap == 0 for gap in gaps)
    hidden = max(outstanding - backlog for _, outstanding, backlog, _ in samples)
    print(
        f"backlog + in flight equal to the calls outstanding in {exact} of {len(gaps)} reads; "
        f"largest gap {worst:.0f}"
    )
    print(f"calls the backlog alone missed at most: {hidden} (the gateway had taken them)")
    return 0 if worst <= 2 * args.concurrency else 1


if __name__ == "__main__":
    raise SystemExit(main())
