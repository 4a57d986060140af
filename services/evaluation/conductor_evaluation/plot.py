"""The report's picture: accuracy (with its 95% interval) against cost per question."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from conductor_evaluation.report import StrategyRow

if TYPE_CHECKING:
    from matplotlib.artist import Artist

MARKERS = {
    "conductor": "*",
    "single": "o",
    "reflect": "s",
    "moa": "D",
    "random": "v",
    "oracle": "^",
}


def plot_accuracy_vs_cost(summary: dict[str, list[StrategyRow]], path: Path, title: str) -> str:
    """Write the PNG; returns what the x axis shows (cost, or tokens when nothing cost money)."""
    import matplotlib

    matplotlib.use("Agg")  # no screen: render to file only
    import matplotlib.pyplot as plt

    rows = [r for suite_rows in summary.values() for r in suite_rows]
    by_cost = any(r.cost_per_question_usd > 0 for r in rows)
    axis = "cost per question (USD)" if by_cost else "tokens per question (every call was free)"
    suites = list(summary)
    names = sorted({r.strategy for r in rows})
    palette = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colours = {name: palette(i % palette.N) for i, name in enumerate(names)}  # same across suites
    fig, axes = plt.subplots(
        1,
        len(suites),
        figsize=(6.5 * len(suites), 5.5 + 0.2 * len(names) / 3),
        squeeze=False,
        constrained_layout=True,
    )
    for ax, suite in zip(axes[0], suites, strict=True):
        for row in summary[suite]:
            x = row.cost_per_question_usd if by_cost else row.tokens_per_question
            low, high = row.ci95
            ax.errorbar(
                [x],
                [row.accuracy * 100],
                # Clamped: at 0% or 100% a bound can sit a rounding error inside the point.
                yerr=[[max(0.0, row.accuracy - low) * 100], [max(0.0, high - row.accuracy) * 100]],
                fmt=MARKERS.get(row.kind, "o"),
                markersize=11 if row.kind == "conductor" else 7,
                capsize=3,
                color=colours[row.strategy],
                label=row.strategy,
            )
        xs = [r.cost_per_question_usd if by_cost else r.tokens_per_question for r in summary[suite]]
        positive = [x for x in xs if x > 0]
        if positive and max(positive) / min(positive) > 20 and len(positive) == len(xs):
            ax.set_xscale("log")
        ax.set_title(f"{suite} (n={max(r.n for r in summary[suite])})")
        ax.set_xlabel(axis)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.grid(True, alpha=0.3)
    # One legend for every panel, below them: labels by the points would pile up where
    # baselines sit on top of each other.
    handles: dict[str, Artist] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend([handles[n] for n in names], names, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return axis
