"""``conductor router``: train conductor-mini's router from evaluation results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

router_app = typer.Typer(help="conductor-mini's learned router.", no_args_is_help=True)


@router_app.command("train")
def train(
    results: str = typer.Argument(
        ..., help="A `conductor eval --strategies 'single:*'` output directory to learn from."
    ),
    out: str = typer.Option("router.json", "--out", "-o", help="The router file."),
    cost_weight: float = typer.Option(
        0.0,
        "--cost-weight",
        min=0.0,
        help="Default trade-off: chance of a right answer given up per USD per 1,000 questions.",
    ),
) -> None:
    """Fit one head per worker on the items outside the held-out split, report every router's
    accuracy/cost curve on the held-out ones, and write the router and REPORT (router.report.json)
    beside it."""
    from conductor_adapters.embedding import QuestionEmbedder
    from conductor_adapters.router import save_router_model
    from conductor_trainer.router import routing_data, train_router

    console = Console(stderr=True, highlight=False)
    data = routing_data(Path(results))
    console.print(
        f"router: {len(data.items)} items, workers {', '.join(data.workers)}; "
        f"{int(data.held_out.sum())} held out"
    )
    progress = Progress(
        TextColumn("[bold]router[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("loading the embeddings", total=None)

    def advance(stage: str, done: int, total: int) -> None:
        progress.update(task, description=stage, completed=done, total=total)

    with progress:
        model, report = train_router(
            data, QuestionEmbedder(), cost_weight=cost_weight, progress=advance
        )
    router_path = Path(out)
    save_router_model(model, router_path)
    report_path = router_path.with_name(router_path.stem + ".report.json")
    report_path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    console.print(_table(report))
    console.print(f"router: {router_path}\nreport: {report_path}")


def _table(report: dict[str, Any]) -> Table:
    """Held-out accuracy and cost: each worker alone, random, the oracle, and per router the
    area under its curve and its most accurate point."""
    table = Table(title=f"held-out items: {report['held_out_items']}")
    for column in ("strategy", "accuracy", "cost per 1k questions (USD)", "curve area"):
        table.add_column(column)
    rows = [(f"single:{w}", s, "") for w, s in report["single"].items()]
    rows += [("random", report["random"], ""), ("oracle", report["oracle"], "")]
    for curve in report["curves"]:
        best = max(curve["points"], key=lambda p: (p["accuracy"], -p["cost_usd"]))
        rows.append((f"{curve['name']} (most accurate)", best, f"{curve['area']:.3f}"))
    for name, point, area in rows:
        table.add_row(name, f"{point['accuracy']:.1%}", f"{point['cost_usd'] * 1000:.3f}", area)
    return table
