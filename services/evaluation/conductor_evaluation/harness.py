"""``conductor eval`` end to end: suites and strategies in, report.md / report.json / PNG out."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conductor.pool import Pool, load_pool_file
from conductor_adapters.settings import Settings, load_pool, load_variants
from conductor_evaluation.datasets import load_suite
from conductor_evaluation.items import EvalItem
from conductor_evaluation.plot import plot_accuracy_vs_cost
from conductor_evaluation.replay import POOL_PREFIX, replay_pool
from conductor_evaluation.report import (
    render_markdown,
    report_json,
    routing,
    suite_mean,
    summarize,
)
from conductor_evaluation.results import ItemResult, ResultStore
from conductor_evaluation.runner import EvalRuntime, pending_jobs, run_jobs
from conductor_evaluation.sim import builtin_sim_pool
from conductor_evaluation.strategies import Kind, Strategy, parse_strategies

DEFAULT_STRATEGIES = "conductor-ultra,single:*,moa,random,oracle"
PLOT_FILE = "accuracy_vs_cost.png"


@dataclass
class EvalOptions:
    suites: list[str]
    limit: int
    strategies: str = DEFAULT_STRATEGIES
    # "sim", "replay:TABLE" (a worker per recorded worker), a pool file, or None for the
    # configured pool
    pool: str | None = None
    out: Path = Path("eval-out")
    seed: int = 0
    concurrency: int = 4
    fresh: bool = False
    step_timeout_s: float = 300.0
    held_out: bool = False  # only items `conductor train` never trains on
    command: str = "conductor eval"


@dataclass
class EvalOutcome:
    report_md: Path
    report_json: Path
    plot: Path
    summary: dict[str, Any]
    ran: int  # jobs run now (the rest came from the result store)
    results: list[ItemResult] = field(default_factory=list)


def resolve_pool(choice: str | None, settings: Settings) -> tuple[Pool, str]:
    """The pool's callable workers (those without their key are left out, as when served)
    and its label for the report."""
    if choice == "sim":
        pool, label = builtin_sim_pool(), "sim (built-in simulated pool)"
    elif choice and choice.startswith(POOL_PREFIX):
        pool = replay_pool(choice.removeprefix(POOL_PREFIX))
        label = f"{choice} (recorded outcomes, replayed)"
    elif choice:
        pool, label = load_pool_file(Path(choice)), choice
    else:
        pool, label = load_pool(settings), str(settings.pool_file or "default pool")
    return Pool(workers=tuple(pool.available())), label


def planner_label(settings: Settings) -> str:
    return f"{settings.planner_backend} {settings.planner_model or settings.local_model}"


OpenRuntime = Callable[[Pool, bool, float], Awaitable[EvalRuntime]]
"""Opens the gateway over a pool and, when asked, the Conductor's planner, with a step timeout:
the entry point wires the same parts a served deployment runs."""


async def evaluate(
    options: EvalOptions,
    settings: Settings,
    open_runtime: OpenRuntime,
    *,
    on_start: Callable[[int], None] = lambda total: None,
    on_result: Callable[[ItemResult], None] = lambda r: None,
) -> EvalOutcome:
    pool, pool_label = resolve_pool(options.pool, settings)
    strategies = parse_strategies(
        options.strategies, pool, load_variants(settings), seed=options.seed
    )
    suites = {name: await asyncio.to_thread(suite_items, name, options) for name in options.suites}
    fingerprint = {
        "pool": [w.snapshot() for w in pool.workers],
        "planner": planner_label(settings),
        "seed": options.seed,
    }
    store = ResultStore(options.out)
    done = store.open(fingerprint, fresh=options.fresh)
    jobs = pending_jobs(suites, strategies, done)
    on_start(len(jobs))
    with_planner = any(s.kind is Kind.CONDUCTOR for s in strategies)
    runtime = await open_runtime(pool, with_planner, options.step_timeout_s)
    try:
        await run_jobs(
            jobs,
            runtime,
            store,
            seed=options.seed,
            concurrency=options.concurrency,
            on_result=on_result,
        )
    finally:
        await runtime.aclose()
    wanted = {(item.suite, item.id) for items in suites.values() for item in items}
    names = {s.name for s in strategies}
    results = [r for r in store.load() if (r.suite, r.item_id) in wanted and r.strategy in names]
    return write_report(options, strategies, results, pool, pool_label, settings, len(jobs))


def suite_items(name: str, options: EvalOptions) -> list[EvalItem]:
    """The seeded sample of a suite, from its held-out share when asked (shuffled too: a
    table's rows come grouped by their source's datasets)."""
    if not options.held_out:
        return load_suite(name, limit=options.limit, seed=options.seed)
    from conductor_evaluation.split import is_held_out

    held = [i for i in load_suite(name, seed=options.seed) if is_held_out(i)]
    random.Random(options.seed).shuffle(held)
    return held[: options.limit]


def write_report(
    options: EvalOptions,
    strategies: list[Strategy],
    results: list[ItemResult],
    pool: Pool,
    pool_label: str,
    settings: Settings,
    ran: int,
) -> EvalOutcome:
    summary = summarize(results, strategies)
    means = suite_mean(results, strategies)
    uses_conductor = any(s.kind is Kind.CONDUCTOR for s in strategies)
    meta: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": options.command,
        "pool_label": pool_label,
        "workers": [w.name for w in pool.workers],
        "simulated_workers": [w.name for w in pool.workers if w.simulated],
        "replay_workers": [w.name for w in pool.workers if w.replayed],
        "planner": planner_label(settings) if uses_conductor else "not evaluated",
        "limit": options.limit,
        "seed": options.seed,
        "held_out": options.held_out,
        "strategies": [s.name for s in strategies],
    }
    out = options.out
    plot_path = out / PLOT_FILE
    if summary:
        title = "Accuracy against cost" + (
            " (simulated workers)"
            if meta["simulated_workers"]
            else " (replayed outcomes)"
            if meta["replay_workers"]
            else ""
        )
        meta["plot_x_axis"] = plot_accuracy_vs_cost(summary, plot_path, title)
    md_path, json_path = out / "report.md", out / "report.json"
    routed = routing(results, summary, meta["workers"])
    md_path.write_text(
        render_markdown(summary, meta, PLOT_FILE if summary else None, routed, means),
        encoding="utf-8",
    )
    document = report_json(summary, meta, routed, means)
    json_path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return EvalOutcome(md_path, json_path, plot_path, document, ran, results)
