"""Compare `conductor eval` runs of different Conductor checkpoints, side by side.

    python scripts/compare_evals.py base=OUT_A warm-up=OUT_B trained=OUT_C [--strategy NAME]

Reads each OUT/report.json and prints, per suite, one Markdown row per run for the Conductor
strategy (--strategy; by default each run's most accurate Conductor variant, named in the
row): accuracy with its 95% interval, the method's mean reward, the plan-valid rate, steps and
tokens per question.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=OUT_DIR (or OUT_DIR) of conductor eval")
    parser.add_argument("--strategy", help="the Conductor variant to compare")
    args = parser.parse_args()
    print(render([load(r) for r in args.runs], args.strategy))


if __name__ == "__main__":
    main()
