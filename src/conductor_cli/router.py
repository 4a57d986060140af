"""``conductor router``: train conductor-mini's router from evaluation results and traces."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from conductor.errors import ConfigurationError
from conductor_cli.progress import progress_bar, stderr_console

router_app = typer.Typer(help="conductor-mini's learned router.", no_args_is_help=True)


@router_app.command("train")
def train(
    results: list[str] | None = typer.Argument(  # noqa: B008 (typer's way to declare a list)
        None,
        help="`conductor eval --strategies 'single:*'` output directories to learn from (the "
        "same items evaluated several times count as their share of right answers); optional "
        "when --traces is given.",
        metavar="EVAL_DIR",
        show_default=False,
    ),
    traces: list[str] | None = typer.Option(  # noqa: B008
        None,
        "--traces",
        help="A `conductor traces export` file to learn from as well (repeatable): each "
        "completed one-step workflow with feedback (0..1) or a reference label says how its "
        "worker did; other rows are skipped and counted.",
        metavar="EXPORT.jsonl",
        show_default=False,
    ),
    tables: list[str] | None = typer.Option(  # noqa: B008
        None,
        "--table",
        help="An outcome table (`conductor outcomes import`) to learn from (repeatable): each "
        "worker recorded on its questions, named as `--pool replay:TABLE` names it; the "
        "table's test split is held out.",
        metavar="TABLE.jsonl",
        show_default=False,
    ),
    out: str = typer.Option(
        "router.json",
        "--out",
        "-o",
        help="The router file; the knn and cluster baselines go beside it (router.knn.json, "
        "router.cluster.json), router files of their own.",
    ),
    cost_weight: float = typer.Option(
        0.0,
        "--cost-weight",
        min=0.0,
        help="Default trade-off: chance of a right answer given up per USD per 1,000 questions.",
    ),
    head: str = typer.Option(
        "auto",
        "--head",
        help="The router's head: `logistic` (one logistic regression per worker), `mlp` (small "
        "networks with one output per worker, trained with torch, served with numpy) or "
        "`auto`: the one with the larger area under the accuracy/cost curve (where every "
        "worker costs the same on each question, the more accurate) in 5-fold "
        "cross-validation on the training items (logistic below 500 of them).",
    ),
) -> None:
    """Fit the router's head (--head) on the items outside the held-out split, report every
    router's accuracy/cost curve on the held-out items every worker ran, and write the router,
    the knn and cluster baselines as routers (router.knn.json, router.cluster.json) and the
    report (router.report.json, router.report.png) beside it. Trace items tell how one worker
    did: when no held-out item was run by every worker, the router is fitted and the report says
    it could not be judged."""
    from conductor_router import HEAD_CHOICES, QuestionEmbedder, save_router_model
    from conductor_trainer.router_mlp import TORCH_INSTALL
    from conductor_trainer.routing_data import (
        combine_routing_data,
        routing_data,
        table_routing_data,
        train_router,
    )
    from conductor_trainer.trace_routing import trace_routing_data

    console = stderr_console()
    if head not in HEAD_CHOICES:
        raise ConfigurationError(f"--head {head!r}: expected one of {', '.join(HEAD_CHOICES)}")
    torchless_auto = head == "auto" and importlib.util.find_spec("torch") is None
    if torchless_auto:
        console.print(
            f"router: the mlp head is not tried: torch is not installed (`{TORCH_INSTALL}`); "
            "fitting the logistic heads"
        )
    if not results and not traces and not tables:
        raise ConfigurationError(
            "nothing to learn from: give `conductor eval` output directories, --traces "
            "exports or --table outcome tables"
        )
    parts = [routing_data([Path(r) for r in results])] if results else []
    parts += [table_routing_data(Path(t)) for t in tables or ()]
    if traces:
        from_traces, summary = trace_routing_data([Path(t) for t in traces])
        console.print(f"traces: {summary.describe()}")
        if not from_traces.items and not parts:
            raise ConfigurationError(
                f"{', '.join(traces)}: no traced workflow can be learnt from (see above)"
            )
        parts.append(from_traces)
    data = combine_routing_data(parts)
    console.print(
        f"router: {len(data.items)} items, workers {', '.join(data.workers)}; "
        f"{int(data.held_out.sum())} held out"
    )
    progress = progress_bar("router", console)
    task = progress.add_task("loading the embeddings", total=None)

    def advance(stage: str, done: int, total: int) -> None:
        progress.update(task, description=stage, completed=done, total=total)

    with progress:
        models, report = train_router(
            data,
            QuestionEmbedder(),
            cost_weight=cost_weight,
            progress=advance,
            head="logistic" if torchless_auto else head,  # checked against HEAD_CHOICES above
        )
    router_path = Path(out)
    written = []
    for name, model in models.items():
        path = (
            router_path
            if name == "router"
            else router_path.with_name(f"{router_path.stem}.{name}.json")
        )
        save_router_model(model, path)
        written.append(str(path))
    report_path = router_path.with_name(router_path.stem + ".report.json")
    report_path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    console.print(_describe_head(report["head"]))
    plot_path = router_path.with_name(router_path.stem + ".report.png")
    if not report["held_out_items"]:
        plot_path.unlink(missing_ok=True)  # an earlier run's curves would read as this one's
        console.print(f"[yellow]warning:[/] {report['note']}")
        console.print(f"routers: {', '.join(written)}\nreport: {report_path}")
        return
    _plot(report, plot_path)
    console.print(_table(report))
    if report["held_out_partial_items"]:
        console.print(
            f"{report['held_out_partial_items']} held-out items not run by every worker (traces) "
            "are not judged"
        )
    console.print(f"routers: {', '.join(written)}\nreport: {report_path}\nplot: {plot_path}")


def _describe_head(choice: dict[str, Any]) -> str:
    """Which head the router got, and the cross-validated scores that chose it."""
    scores = ", ".join(f"{name} {score:.4f}" for name, score in choice["cv"].items())
    if choice["asked"] != "auto":
        how = f"as asked (--head {choice['asked']})"
    elif len(choice["cv"]) < 2:
        how = "too few training items every worker ran to cross-validate: kept by default"
    elif choice["cv_measure"] == "accuracy":
        how = "the more accurate (every worker costs the same on each question)"
    else:
        how = "the larger area under the accuracy/cost curve"
    measure = {"area": "areas", "accuracy": "accuracies"}.get(choice["cv_measure"], "")
    folds = f"; {choice['cv_folds']}-fold cross-validation {measure}: {scores}" if scores else ""
    return f"router head: {choice['chosen']}, {how}{folds}"


def _plot(report: dict[str, Any], path: Path) -> None:
    """Accuracy against cost per 1,000 questions: each router's curve over the cost weights,
    each worker alone, random and the oracle as points."""
    import matplotlib

    matplotlib.use("Agg")  # no screen: render to file only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for curve in report["curves"]:
        points = sorted(curve["points"], key=lambda p: p["cost_usd"])
        low, high = curve["area_ci"]
        ax.plot(
            [p["cost_usd"] * 1000 for p in points],
            [p["accuracy"] for p in points],
            marker=".",
            label=f"{curve['name']} (area {curve['area']:.3f}, 95% CI {low:.3f}-{high:.3f})",
        )
    for name, point, marker in [
        *((f"single:{w}", s, "o") for w, s in report["single"].items()),
        ("random", report["random"], "v"),
        ("oracle", report["oracle"], "^"),
    ]:
        ax.scatter(point["cost_usd"] * 1000, point["accuracy"], marker=marker, label=name, s=40)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("cost per 1,000 questions (USD)")
    ax.set_ylabel("accuracy on held-out items")
    ax.set_title(
        f"conductor-mini routers (router: {report['head']['chosen']} head), "
        f"{report['held_out_items']} held-out items"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(report: dict[str, Any]) -> Table:
    """Held-out accuracy and cost: each worker alone, random, the oracle, and per router the
    area under its curve and its most accurate point."""
    table = Table(title=f"held-out items: {report['held_out_items']}")
    columns = ("strategy", "accuracy", "cost per 1k questions (USD)", "curve area (95% CI)")
    for column in columns:
        table.add_column(column)
    rows = [(f"single:{w}", s, "") for w, s in report["single"].items()]
    rows += [("random", report["random"], ""), ("oracle", report["oracle"], "")]
    for curve in report["curves"]:
        best = max(curve["points"], key=lambda p: (p["accuracy"], -p["cost_usd"]))
        low, high = curve["area_ci"]
        area = f"{curve['area']:.3f} ({low:.3f}-{high:.3f})"
        rows.append((f"{curve['name']} (most accurate)", best, area))
    for name, point, area in rows:
        table.add_row(name, f"{point['accuracy']:.1%}", f"{point['cost_usd'] * 1000:.3f}", area)
    return table
