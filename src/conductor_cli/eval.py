"""``conductor eval``: the Conductor against single workers and the usual multi-agent recipes."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from conductor_adapters.settings import get_settings
from conductor_cli.progress import progress_bar, stderr_console


def eval_command(
    suite: str = typer.Option(
        "gsm8k",
        "--suite",
        "-s",
        help="Comma-separated suites: gsm8k, math500, arc-challenge, arc-easy, mmlu, humaneval, "
        "mbpp, rg:<reasoning-gym generator>, table:<outcome table>[#domain] (judged by "
        "recorded scores, with a replay pool), or a JSONL file (question, answer, kind).",
    ),
    limit: int = typer.Option(30, "--limit", "-n", min=1, help="Items per suite (seeded sample)."),
    strategies: str = typer.Option(
        "conductor-ultra,single:*,moa,random,oracle",
        "--strategies",
        help="Comma-separated: a variant (conductor-mini, conductor-ultra, ...), single:NAME, "
        "single:*, reflect:NAME[:K], moa[:A+B>AGG], random, oracle.",
    ),
    pool: str | None = typer.Option(
        None,
        "--pool",
        help="'sim' for the built-in simulated pool, 'replay:<outcome table>' for its recorded "
        "workers, a pool YAML file, or unset for the configured pool (CONDUCTOR_POOL_FILE, "
        "else the local model and keyed cloud workers).",
    ),
    out: str = typer.Option("eval-out", "--out", "-o", help="Report directory."),
    seed: int = typer.Option(0, "--seed", help="Seeds the item sample, random router and sim."),
    concurrency: int = typer.Option(4, "--concurrency", "-c", min=1, help="Workflows at once."),
    fresh: bool = typer.Option(False, "--fresh", help="Discard results cached in --out."),
    step_timeout: float = typer.Option(300.0, "--step-timeout", min=1, help="Seconds per step."),
    held_out: bool = typer.Option(
        False, "--held-out", help="Only items of the held-out share conductor train never uses."
    ),
) -> None:
    """Evaluate strategies on benchmark suites; writes report.md, report.json and a PNG plot.

    Results are cached per item and strategy in OUT/results.jsonl: run the same command again
    to resume an interrupted evaluation.
    """
    from conductor.pool import Pool
    from conductor_cli.wiring import open_eval_runtime
    from conductor_evaluation.harness import EvalOptions, evaluate
    from conductor_evaluation.results import ItemResult

    options = EvalOptions(
        suites=[s.strip() for s in suite.split(",") if s.strip()],
        limit=limit,
        strategies=strategies,
        pool=pool,
        out=Path(out),
        seed=seed,
        concurrency=concurrency,
        fresh=fresh,
        step_timeout_s=step_timeout,
        held_out=held_out,
        command=shlex.join(["conductor", *sys.argv[1:]]),
    )
    console = stderr_console()
    progress = progress_bar("eval", console, remaining=True)
    task = progress.add_task("loading", total=None)
    right, done, total = 0, 0, 0

    def started(jobs: int) -> None:
        nonlocal total
        total = jobs
        progress.update(task, total=jobs, description="running")

    def finished(result: ItemResult) -> None:
        nonlocal right, done
        right, done = right + result.correct, done + 1
        progress.update(task, advance=1, description=f"right so far {right}/{done}")
        # Without a terminal (CI, a log file) the bar is not drawn: a line every 5% instead.
        if not console.is_terminal and (done == total or done % max(1, total // 20) == 0):
            console.print(f"eval: {done}/{total} workflows, right so far {right}/{done}")

    settings = get_settings()

    def open_runtime(pool: Pool, with_planner: bool, step_timeout_s: float) -> Any:
        return open_eval_runtime(
            settings, pool, with_planner=with_planner, step_timeout_s=step_timeout_s
        )

    with progress:
        outcome = asyncio.run(
            evaluate(options, settings, open_runtime, on_start=started, on_result=finished)
        )
    _print_summary(Console(highlight=False), outcome.summary)
    typer.echo(f"ran {outcome.ran} workflows; report: {outcome.report_md}")
    typer.echo(f"json: {outcome.report_json}")
    typer.echo(f"plot: {outcome.plot}")


def _print_summary(console: Console, document: dict[str, object]) -> None:
    suites = document.get("suites")
    assert isinstance(suites, dict)
    if document.get("simulated_workers"):
        console.print("[yellow]simulated workers (provider sim): not LLMs[/]")
    if document.get("replay_workers"):
        console.print(
            "[yellow]replayed workers (provider replay): recorded answers, judged by recorded "
            "scores; multi-step plans' figures are a lower bound[/]"
        )
    for suite, rows in suites.items():
        table = Table(title=suite)
        for column in ("strategy", "accuracy", "95% CI", "tokens/q", "cost/q", "steps", "p50 s"):
            table.add_column(column, justify="left" if column == "strategy" else "right")
        for row in rows:
            low, high = row["ci95"]
            table.add_row(
                row["strategy"],
                f"{row['accuracy']:.1%}",
                f"{low:.0%}-{high:.0%}",
                f"{row['tokens_per_question']:,.0f}",
                f"{row['cost_per_question_usd']:.5f}",
                f"{row['steps_per_question']:.2f}",
                f"{row['latency_p50_s']:.2f}",
            )
        console.print(table)
    means = document.get("suite_mean")
    if isinstance(means, dict):
        _print_suite_mean(console, means)


def _print_suite_mean(console: Console, means: dict[str, Any]) -> None:
    """The unweighted mean over the suites, as routing papers compare strategies."""
    best = means["best_single"]
    table = Table(
        title=f"mean over {len(means['suites'])} suites (each counts the same)",
        caption=f"minus best single: percentage points against {best}, over the items both scored"
        if best
        else "no single worker was scored on every suite",
    )
    for column in ("strategy", "accuracy", "95% CI", "minus best single (95% CI)", "cost/q"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in means["strategies"]:
        low, high = row["ci95"]
        margin = ""
        if row["minus_best_single"] is not None:
            m_low, m_high = row["minus_best_single_ci95"]
            margin = (
                f"{100 * row['minus_best_single']:+.1f} ({100 * m_low:+.1f} to {100 * m_high:+.1f})"
            )
        table.add_row(
            row["strategy"],
            f"{row['mean_accuracy']:.1%}",
            f"{low:.0%}-{high:.0%}",
            margin,
            f"{row['mean_cost_per_question_usd']:.5f}",
        )
    console.print(table)
    for name, suites in means["left_out"].items():
        console.print(f"left out of the mean: {name}, not scored on {', '.join(suites)}")
