"""Compare `conductor eval` runs of different Conductor checkpoints, side by side.

    python scripts/compare_evals.py base=OUT_A warm-up=OUT_B trained=OUT_C [--strategy NAME]

Reads each OUT/report.json and prints, per suite, one Markdown row per run for the Conductor
strategy (--strategy; by default each run's most accurate Conductor variant, named in the
row): accuracy with its 95% interval, the method's mean reward, the plan-valid rate, steps and
tokens per question.

Then, over every suite at once ("all suites", which `conductor eval` writes when it ran more
than one), each run's Conductor beside the last run's baselines (single workers, MoA, random,
oracle, routers), with cost as a share of the best single worker's and tokens as a share of
MoA's, and the last run's Conductor checked against the marks: accuracy at least the best
single worker's, at most 60% of its cost and 25% of MoA's tokens, and 98% valid plans.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

POOLED = "all suites"  # conductor eval's pseudo-suite over every suite of a run
COST_MARK, TOKENS_MARK, VALID_MARK = 0.60, 0.25, 0.98


def load(label_and_dir: str) -> tuple[str, dict[str, Any]]:
    label, sep, directory = label_and_dir.partition("=")
    if not sep:
        label, directory = Path(label_and_dir).name, label_and_dir
    path = Path(directory) / "report.json"
    try:
        return label, json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        sys.exit(f"{path}: {exc}")


def conductor_row(rows: list[dict[str, Any]], strategy: str | None) -> dict[str, Any] | None:
    for row in rows:
        if (strategy is None and row["kind"] == "conductor") or row["strategy"] == strategy:
            return row
    return None


def render(runs: list[tuple[str, dict[str, Any]]], strategy: str | None) -> str:
    suites = sorted({suite for _, report in runs for suite in report["suites"]})
    lines = []
    for suite in suites:
        lines += [
            f"### {suite}",
            "",
            "| run | planner | strategy | n | accuracy | 95% CI | mean reward | plan valid "
            "| steps/q | tokens/q |",
            "|---|---|---|---:|---:|---|---:|---:|---:|---:|",
        ]
        for label, report in runs:
            row = conductor_row(report["suites"].get(suite, []), strategy)
            if row is None:
                lines.append(f"| {label} | {report['planner']} |{' - |' * 8}")
                continue
            low, high = row["ci95"]
            valid = row["plan_valid_rate"]
            reward = row.get("mean_reward")  # reports written before it was added lack it
            lines.append(
                f"| {label} | {report['planner']} | {row['strategy']} | {row['n']} "
                f"| {row['accuracy']:.1%} | {low:.1%} - {high:.1%} "
                f"| {'-' if reward is None else f'{reward:.3f}'} "
                f"| {'' if valid is None else f'{valid:.0%}'} | {row['steps_per_question']:.2f} "
                f"| {row['tokens_per_question']:,.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def best_single(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The most accurate single worker; the cheaper one of equals."""
    singles = [r for r in rows if r["kind"] == "single"]
    return min(singles, key=lambda r: (-r["accuracy"], r["cost_per_question_usd"]), default=None)


def _share(value: float, of: float | None) -> str:
    return "-" if not of else f"{value / of:.0%}"


def render_baselines(runs: list[tuple[str, dict[str, Any]]], strategy: str | None) -> str:
    """Over all suites: every run's Conductor, then the last run's baselines, then the marks."""
    last_label, last = runs[-1]
    pooled = last["suites"].get(POOLED)
    if not pooled:
        return ""
    single = best_single(pooled)
    moa = next((r for r in pooled if r["kind"] == "moa"), None)
    single_cost = single["cost_per_question_usd"] if single else None
    moa_tokens = moa["tokens_per_question"] if moa else None
    baselines = [("baseline", r) for r in pooled if r["kind"] != "conductor"]
    lines = (
        [
            f"### {POOLED}: against the baselines",
            "",
            f"Cost as a share of the best single worker's ({single['strategy']}), tokens "
            "as a share of MoA's; the baselines are the last run's.",
            "",
        ]
        if single is not None
        else [f"### {POOLED}", "", "(The last run has no baselines to compare with.)", ""]
    )
    lines += [
        "| run | strategy | n | accuracy | 95% CI | cost/q (USD) | of best single | tokens/q "
        "| of MoA | plan valid |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    conductors = [
        (label, conductor_row(r["suites"].get(POOLED, []), strategy)) for label, r in runs
    ]
    for label, row in [*conductors, *baselines]:
        if row is None:
            lines.append(f"| {label} |{' - |' * 9}")
            continue
        low, high = row["ci95"]
        valid = row.get("plan_valid_rate")
        lines.append(
            f"| {label} | {row['strategy']} | {row['n']} "
            f"| {row['accuracy']:.1%} | {low:.1%} - {high:.1%} "
            f"| {row['cost_per_question_usd']:.6f} "
            f"| {_share(row['cost_per_question_usd'], single_cost)} "
            f"| {row['tokens_per_question']:,.0f} "
            f"| {_share(row['tokens_per_question'], moa_tokens)} "
            f"| {'' if valid is None else f'{valid:.0%}'} |"
        )
    trained = conductors[-1][1]
    if trained is not None and single is not None:
        lines += ["", f"Marks for {last_label} ({trained['strategy']}):", ""]
        lines += _marks(trained, single, moa)
    return "\n".join([*lines, ""])


def _marks(
    trained: dict[str, Any], single: dict[str, Any], moa: dict[str, Any] | None
) -> list[str]:
    def line(held: bool, text: str) -> str:
        return f"- [{'x' if held else ' '}] {text}"

    accuracy_gap = trained["accuracy"] - single["accuracy"]
    cost_share = trained["cost_per_question_usd"] / (single["cost_per_question_usd"] or 1.0)
    valid = trained.get("plan_valid_rate") or 0.0
    out = [
        line(
            accuracy_gap >= 0,
            f"accuracy {trained['accuracy']:.1%} against the best single worker's "
            f"{single['accuracy']:.1%} ({accuracy_gap:+.1%})",
        ),
        line(
            cost_share <= COST_MARK,
            f"cost {cost_share:.0%} of the best single worker's (mark: {COST_MARK:.0%})",
        ),
    ]
    if moa is not None:
        tokens_share = trained["tokens_per_question"] / (moa["tokens_per_question"] or 1.0)
        out.append(
            line(
                tokens_share <= TOKENS_MARK,
                f"tokens {tokens_share:.0%} of MoA's (mark: {TOKENS_MARK:.0%})",
            )
        )
    out.append(line(valid >= VALID_MARK, f"valid plans {valid:.1%} (mark: {VALID_MARK:.0%})"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=OUT_DIR (or OUT_DIR) of conductor eval")
    parser.add_argument("--strategy", help="the Conductor variant to compare")
    args = parser.parse_args()
    runs = [load(r) for r in args.runs]
    print(render(runs, args.strategy))
    print(render_baselines(runs, args.strategy))


if __name__ == "__main__":
    main()
