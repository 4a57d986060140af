"""How long conductor-mini takes to decide: the learned router against the language model's
one-step plan, measured in the same run on the same questions.

Both go through the planner as serving runs it (``ConductorPlanner.plan`` on a one-step
request of conductor-mini's settings): the router embeds the question and scores the workers;
the language model (the configured planner backend, by default SmolLM2 through llama.cpp)
writes a plan. Questions are a sample of GSM8K, MMLU and MBPP items, the pool the simulated
one. Also printed: the memory the router adds to the process once loaded (resident set size
before and after loading it and deciding once).

    python benchmarks/routing_latency.py [--router router.json] [--questions 200]
        [--model-questions 8]

Without ``--router`` a router with random heads over the simulated pool's workers is used: how
long a decision takes does not depend on what the heads learnt. With ``--router`` the pool is
the router's own workers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import numpy as np

from conductor.ports import PlanRequest
from conductor.variants import BUILTIN_VARIANTS
from conductor.workflow import PoolEntry
from conductor_adapters.settings import get_settings
from conductor_cli.wiring import planner_backend
from conductor_evaluation.datasets import load_suite
from conductor_evaluation.sim import builtin_sim_pool
from conductor_planner import ConductorPlanner
from conductor_router import Router, RouterModel, WorkerHead

MINI = BUILTIN_VARIANTS["conductor-mini"]


def resident_mb() -> float:
    """This process's resident set size, from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def random_router(names: list[str]) -> RouterModel:
    rng = np.random.default_rng(0)
    return RouterModel(
        dim=256,
        workers=[
            WorkerHead(
                name=name,
                coef=(rng.normal(size=256) / 16).tolist(),
                intercept=0.0,
                cost_usd=float(rng.uniform(0.0001, 0.01)),
                trained_on=0,
            )
            for name in names
        ],
    )


def request(question: str, pool: list[PoolEntry]) -> PlanRequest:
    return PlanRequest(
        question=question,
        pool=pool,
        max_steps=1,
        workflow_max_steps=1,
        temperature=MINI.planner_temperature,
        max_tokens=MINI.planner_max_tokens,
    )


async def time_plans(
    planner: ConductorPlanner, questions: list[str], pool: list[PoolEntry]
) -> tuple[list[float], list[str]]:
    """Milliseconds per decision, and the backend that made each."""
    latencies, backends = [], []
    for question in questions:
        started = time.perf_counter()
        outcome = await planner.plan(request(question, pool))
        latencies.append((time.perf_counter() - started) * 1000)
        backends.append(outcome.backend)
    return latencies, backends


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def main(options: argparse.Namespace) -> None:
    pool = [PoolEntry(name=w.name, description=w.description) for w in builtin_sim_pool().workers]
    items = [
        item
        for suite in ("gsm8k", "mmlu", "mbpp")
        for item in load_suite(suite, limit=options.questions // 3 + 1, seed=1)
    ]
    questions = [item.question for item in items][: options.questions]

    before = resident_mb()
    if options.router:
        router = Router.load(options.router)
        # The pool a request shows is the router's own workers (a router trained on an outcome
        # table knows the recorded models, not the simulated ones).
        pool = [PoolEntry(name=name, description=f"worker {name}") for name in router.names]
    else:
        router = Router(random_router([entry.name for entry in pool]))
    routed_planner = ConductorPlanner(backend=None, router=router)  # type: ignore[arg-type]
    await routed_planner.plan(request(questions[0], pool))  # first use: caches warm
    router_mb = resident_mb() - before
    routed, backends = await time_plans(routed_planner, questions, pool)
    assert set(backends) == {"router"}, backends

    settings = get_settings()
    print(f"loading the planner backend ({settings.planner_backend}) ...", flush=True)
    backend = await asyncio.to_thread(planner_backend, settings)
    try:
        model_planner = ConductorPlanner(backend)
        await model_planner.plan(request(questions[0], pool))  # warm-up: prompt cache, first load
        sample = questions[: options.model_questions]
        planned, _ = await time_plans(model_planner, sample, pool)
    finally:
        await backend.aclose()

    p50_router, p50_model = percentile(routed, 50), percentile(planned, 50)
    print(
        f"router ({router.model.embedder}, {len(router.names)} workers): "
        f"p50 {p50_router:.2f} ms, p95 {percentile(routed, 95):.2f} ms over {len(routed)} "
        f"questions; memory +{router_mb:.0f} MB once loaded"
    )
    print(
        f"language-model one-step plan ({backend.name}): p50 {p50_model:.0f} ms, "
        f"p95 {percentile(planned, 95):.0f} ms over {len(planned)} questions"
    )
    print(f"router faster by {p50_model / p50_router:,.0f}x (p50 against p50)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", type=Path, help="a router file (default: random heads)")
    parser.add_argument("--questions", type=int, default=200, help="routed questions")
    parser.add_argument(
        "--model-questions", type=int, default=8, help="questions planned by the model"
    )
    asyncio.run(main(parser.parse_args()))
