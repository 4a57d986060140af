"""Training metrics: one JSON line per logged step, and the curve drawn from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# TRL's names for what the curve shows (reward of our one reward function, and the metrics the
# reward logs through ``log_metric``).
REWARD = "reward"
FORMAT_VALID = "format_valid"
STEPS_PER_PLAN = "steps_per_plan"
ACCURACY = "accuracy"
RECURSION_RATE = "recursion_rate"  # the recursion stage only
# How the valid plans routed: per worker (this prefix + its name) the share of plans that gave
# it a step, and the share of plans with a step that saw an earlier step's output.
WORKER_SHARE = "worker_share/"
SEES_EARLIER = "sees_earlier"
# A cost-aware reward's cost term: valid plans' workers' cost over their question's most
# expensive single call, averaged.
PLAN_COST = "relative_cost"


class MetricsFile:
    def __init__(self, path: Path, *, append: bool = False, curve: Path | None = None) -> None:
        self.path = path
        self.curve = curve  # redrawn at every checkpoint: a run stopped early keeps its curve
        # A resumed run keeps the file: it redoes the steps after its last checkpoint and logs
        # them again, so rows are de-duplicated by step when read (the last one counts).
        if not (append and path.exists()):
            path.write_text("", encoding="utf-8")

    def write(self, step: int, logs: dict[str, Any]) -> None:
        row = {"step": step, **{k: v for k, v in logs.items() if isinstance(v, int | float)}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def callback(self, transformers: Any) -> Any:
        """A transformers TrainerCallback that appends each log to the file."""
        outer = self

        class WriteMetrics(transformers.TrainerCallback):  # type: ignore[misc]
            def on_log(
                self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any
            ) -> None:
                if logs and REWARD in logs:
                    outer.write(int(state.global_step), logs)

            def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                if outer.curve is not None and read_metrics(outer.path):
                    plot_training_curve(outer.path, outer.curve)

        return WriteMetrics()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """One row per step, the last logged winning (a resumed run logs some steps again)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return sorted({row["step"]: row for row in rows}.values(), key=lambda row: row["step"])


def plot_training_curve(metrics_path: Path, out: Path) -> None:
    """Mean reward, format-valid rate and steps per plan against the training step, and how
    the valid plans routed (each worker's share, steps that saw an earlier step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    steps = [r["step"] for r in rows]
    fig, (left, right, routed) = plt.subplots(1, 3, figsize=(16, 4), constrained_layout=True)
    for key, label in (
        (REWARD, "mean reward"),
        (FORMAT_VALID, "format-valid rate"),
        (ACCURACY, "accuracy"),
        (RECURSION_RATE, "recursion rate"),
    ):
        values = [r.get(key) for r in rows]
        if any(v is not None for v in values):
            left.plot(steps, values, marker="o", markersize=3, label=label)
    left.set_xlabel("training step")
    left.set_ylim(-0.02, 1.02)
    left.legend()
    left.grid(True, alpha=0.3)
    right.plot(steps, [r.get(STEPS_PER_PLAN, 0) for r in rows], marker="o", markersize=3)
    right.set_xlabel("training step")
    right.set_ylabel("worker steps per valid plan")
    right.grid(True, alpha=0.3)
    workers = sorted(
        {k.removeprefix(WORKER_SHARE) for r in rows for k in r if k.startswith(WORKER_SHARE)}
    )
    # matplotlib's default cycle has 10 colours: a pool of more would repeat them.
    colours = plt.get_cmap("tab20" if len(workers) > 10 else "tab10")
    for index, worker in enumerate(workers):
        shares = [r.get(WORKER_SHARE + worker) for r in rows]
        routed.plot(steps, shares, marker=".", label=worker, color=colours(index))
    if any(SEES_EARLIER in r for r in rows):
        routed.plot(
            steps,
            [r.get(SEES_EARLIER) for r in rows],
            linestyle="--",
            color="black",
            label="a step sees an earlier one",
        )
    routed.set_xlabel("training step")
    routed.set_ylabel("share of valid plans")
    routed.set_ylim(-0.02, 1.02)
    routed.grid(True, alpha=0.3)
    if workers:
        routed.legend(fontsize=7)
    fig.suptitle("Conductor GRPO training")
    fig.savefig(out, dpi=120)
    plt.close(fig)
