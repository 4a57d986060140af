"""What the HTTP API adds to a workflow: the same workflows run in-process, then over HTTP.

Embedded runtime on SQLite, a scripted two-step Conductor and scripted workers that answer in
LATENCY seconds (no model, so the figure is the machinery's own). Baseline, measured in the
same run: WORKFLOWS workflows started at once through the service directly (record, run,
trace, events). Then the same number as concurrent chat completions through the served API
(uvicorn, auth against the key table, submission, following the events until the outcome,
reading the workflow back) with the official async openai client.

    python benchmarks/api_overhead.py [--workflows 50] [--latency 0.2]

Prints wall times, per-request latency p50/p95 and the ratio of the two walls.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import openai  # noqa: E402

from conductor_adapters.store.keys import create_key  # noqa: E402
from conductor_api.rules import Caller  # noqa: E402

from fakes.api_server import LiveApi, scripted_service  # noqa: E402
from fakes.scripted import ScriptedWorker  # noqa: E402

QUESTION: list[Any] = [{"role": "user", "content": "What is 6 * 7?"}]


def _workers(latency: float) -> list[ScriptedWorker]:
    return [ScriptedWorker(name, delay_s=latency) for name in ("alpha", "beta")]


def _percentiles(latencies: list[float]) -> str:
    cuts = statistics.quantiles(latencies, n=20)
    return f"p50 {statistics.median(latencies):.2f} s, p95 {cuts[18]:.2f} s"


def direct(database: Path, count: int, latency: float) -> tuple[float, list[float]]:
    """Submit through the service in its own loop and follow each workflow to its outcome."""
    api = LiveApi(lambda: scripted_service(f"sqlite:///{database}", _workers(latency)))
    service = api.service
    caller = Caller(tenant="bench")

    async def one() -> float:
        started = time.perf_counter()
        accepted = await service.start_workflow(caller, "What is 6 * 7?", variant="conductor-ultra")
        async for _ in service.follow(accepted.workflow_id, caller.tenant):
            pass
        return time.perf_counter() - started

    async def all_of_them() -> list[float]:
        return list(await asyncio.gather(*(one() for _ in range(count))))

    try:
        started = time.perf_counter()
        latencies = api.loop.run(all_of_them())
        return time.perf_counter() - started, latencies
    finally:
        api.close()


def over_http(database: Path, count: int, latency: float) -> tuple[float, list[float]]:
    api = LiveApi(lambda: scripted_service(f"sqlite:///{database}", _workers(latency)))
    key = create_key(api.service.engine, "bench").secret

    async def run() -> list[float]:
        client = openai.AsyncOpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0)

        async def one() -> float:
            started = time.perf_counter()
            reply = await client.chat.completions.create(model="conductor-ultra", messages=QUESTION)
            if (reply.model_extra or {}).get("conductor", {}).get("status") != "completed":
                raise RuntimeError(f"a workflow did not complete: {reply}")
            return time.perf_counter() - started

        async with client:
            return list(await asyncio.gather(*(one() for _ in range(count))))

    try:
        started = time.perf_counter()
        latencies = asyncio.run(run())
        return time.perf_counter() - started, latencies
    finally:
        api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workflows", type=int, default=50)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per worker answer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base_wall, base = direct(Path(tmp) / "direct.db", args.workflows, args.latency)
        http_wall, http = over_http(Path(tmp) / "http.db", args.workflows, args.latency)
    print(f"{args.workflows} two-step workflows at once, workers answering in {args.latency} s")
    print(f"  in-process (baseline): {base_wall:.2f} s wall; {_percentiles(base)}")
    print(f"  over HTTP (openai SDK): {http_wall:.2f} s wall; {_percentiles(http)}")
    print(f"  HTTP / in-process wall: {http_wall / base_wall:.2f}")


if __name__ == "__main__":
    main()
