"""The evaluation report: per suite and strategy, accuracy with its confidence interval, tokens,
cost, steps and latency, and how each strategy routed (which workers it used, how many steps,
how often a step saw an earlier one's output); as Markdown (``report.md``) and JSON
(``report.json``). With several suites, also each strategy's unweighted mean over the suites,
as routing research reports it over a group of benchmarks, against the best single worker's,
with bootstrap intervals.

Accuracy is the mean score: 1 or 0 by a verifier, or a recorded score between (an outcome
table's question). A table's question that a strategy's workflow could not replay (a worker it
called has no recorded score there) is left out of that strategy's figures and counted apart.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel

from conductor_evaluation.results import UNRECORDED, ItemResult
from conductor_evaluation.reward import method_reward
from conductor_evaluation.strategies import Kind, Strategy

Z95 = 1.959964
# The pseudo-suite that pools every item of every suite of a run, reported after the suites
# when there are several: a mixed suite judged as a whole.
ALL_SUITES = "all suites"
# Resamples of the bootstrap intervals of the mean over suites, seeded so that the same results
# give the same report.
BOOTSTRAP = 1000
BOOTSTRAP_SEED = 0


class StrategyRow(BaseModel):
    strategy: str
    kind: str
    n: int  # items scored (those not recorded are left out)
    correct: int  # of them, judged right (a recorded score of 0.5 or more)
    accuracy: float  # the mean score
    ci95: tuple[float, float]
    tokens_per_question: float
    cost_per_question_usd: float
    steps_per_question: float
    latency_p50_s: float
    latency_p95_s: float
    failed: int  # workflows that did not complete (counted as wrong)
    plan_valid_rate: float | None = None  # Conductor only
    # The training reward (0 invalid plan / 0.5 wrong / 1 right); baselines' plans are valid.
    mean_reward: float = 0.0
    # Outcome tables' questions left out: a worker the workflow called was not recorded on them.
    unrecorded: int = 0


class RoutingRow(BaseModel):
    """How one strategy's plans used the pool on one suite."""

    strategy: str
    n: int
    # Per worker, the share of questions whose plan gave it a step.
    worker_share: dict[str, float]
    # Per number of worker steps, how many plans had it.
    plans_by_steps: dict[int, int]
    # The share of plans with a step that saw an earlier step's output (a check, a refinement).
    sees_earlier_share: float


class SuiteMeanRow(BaseModel):
    """One strategy over the suites: each suite counts the same, whatever its number of items."""

    strategy: str
    kind: str
    mean_accuracy: float  # the unweighted mean of its per-suite accuracies
    ci95: tuple[float, float]
    mean_cost_per_question_usd: float  # the unweighted mean of its per-suite cost per question
    # Against the best single worker, paired: per suite over the items both scored, then
    # averaged over the suites; None where some suite has no such item.
    minus_best_single: float | None = None
    minus_best_single_ci95: tuple[float, float] | None = None
    paired_items: int = 0  # the items both scored, over all the suites


class SuiteMean(BaseModel):
    """The mean over suites of every strategy scored on each of them."""

    suites: list[str]
    # The single worker with the highest mean (the cheapest among equals); None if no single
    # worker was scored on every suite.
    best_single: str | None
    strategies: list[SuiteMeanRow]
    # Per strategy left out, the suites on which it scored no item.
    left_out: dict[str, list[str]]
    bootstrap: str


def wilson(correct: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval: honest at small n and at 0% or 100%, unlike the normal one.
    ``correct`` is the sum of the scores, fractional where scores are."""
    if n == 0:
        return (0.0, 0.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def bootstrap_mean_of_means(
    groups: Sequence[Sequence[float]], resamples: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """95% percentile interval of the unweighted mean of the groups' means, each group (a
    suite's item scores, or paired differences) resampled with replacement within itself: the
    suites' sizes are fixed by the run, only which items they drew is chance. Every group must
    have a value."""
    rng = random.Random(seed)
    means = [
        sum(sum(rng.choices(group, k=len(group))) / len(group) for group in groups) / len(groups)
        for _ in range(resamples)
    ]
    return (percentile(means, 0.025), percentile(means, 0.975))


def oracle_results(results: Iterable[ItemResult], singles: Sequence[str]) -> list[ItemResult]:
    """Per item, the best single worker: the highest score, the cheapest among equals; among
    the workers recorded on it, for an outcome table's question."""
    by_item: dict[tuple[str, str], list[ItemResult]] = defaultdict(list)
    for r in results:
        if r.strategy in singles:
            by_item[(r.suite, r.item_id)].append(r)
    out = []
    for runs in by_item.values():
        if len(runs) < len(singles):
            continue  # not every worker has answered it yet
        recorded = [r for r in runs if r.status != UNRECORDED]
        pick = min(recorded or runs, key=lambda r: (-r.value, r.cost_usd, r.tokens))
        out.append(pick.model_copy(update={"strategy": "oracle"}))
    return out


def summarize(
    results: Sequence[ItemResult], strategies: Sequence[Strategy]
) -> dict[str, list[StrategyRow]]:
    """Rows per suite, best accuracy first; with several suites, also their pool (ALL_SUITES)
    last."""
    kinds = {s.name: s.kind for s in strategies}
    everything = _with_oracle(results, strategies)
    grouped = _by_suite(everything, kinds)
    if len(grouped) > 1:  # a mixed suite is also judged as a whole
        for r in everything:
            if r.strategy in kinds:
                grouped[ALL_SUITES][r.strategy].append(r)
    return {
        suite: sorted(
            (_row(name, kinds[name], rows) for name, rows in by_strategy.items()),
            key=lambda row: (-row.accuracy, row.cost_per_question_usd, row.strategy),
        )
        for suite, by_strategy in grouped.items()
    }


def _with_oracle(results: Sequence[ItemResult], strategies: Sequence[Strategy]) -> list[ItemResult]:
    """The results, and the oracle's where it is one of the strategies."""
    everything = list(results)
    if any(s.kind is Kind.ORACLE for s in strategies):
        singles = [s.name for s in strategies if s.kind is Kind.SINGLE]
        everything += oracle_results(results, singles)
    return everything


def _by_suite(
    results: Iterable[ItemResult], names: Iterable[str]
) -> dict[str, dict[str, list[ItemResult]]]:
    """Per suite and strategy (of ``names``) the results, in their order."""
    wanted = set(names)
    grouped: dict[str, dict[str, list[ItemResult]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.strategy in wanted:
            grouped[r.suite][r.strategy].append(r)
    return grouped


def suite_mean(results: Sequence[ItemResult], strategies: Sequence[Strategy]) -> SuiteMean | None:
    """With two suites or more, each strategy scored on every one of them: the unweighted mean
    of its per-suite accuracies and costs, and its margin over the best single worker, paired
    item by item; None with one suite."""
    kinds = {s.name: s.kind for s in strategies}
    grouped = _by_suite(_with_oracle(results, strategies), kinds)
    if len(grouped) < 2:
        return None
    suites = list(grouped)
    # Per strategy and suite, its scored items by id (sorted: the resamples do not depend on
    # the order in which results were written).
    scored: dict[str, list[dict[str, ItemResult]]] = {}
    left_out: dict[str, list[str]] = {}
    for name in dict.fromkeys(n for by_strategy in grouped.values() for n in by_strategy):
        per_suite = [
            {
                r.item_id: r
                for r in sorted(grouped[suite].get(name, []), key=lambda r: r.item_id)
                if r.status != UNRECORDED
            }
            for suite in suites
        ]
        missing = [suite for suite, items in zip(suites, per_suite, strict=True) if not items]
        if missing:
            left_out[name] = missing
        else:
            scored[name] = per_suite
    rows = {
        name: SuiteMeanRow(
            strategy=name,
            kind=kinds[name].value,
            mean_accuracy=_mean([_mean([r.value for r in items.values()]) for items in per]),
            ci95=bootstrap_mean_of_means([[r.value for r in items.values()] for items in per]),
            mean_cost_per_question_usd=_mean(
                [_mean([r.cost_usd for r in items.values()]) for items in per]
            ),
        )
        for name, per in scored.items()
    }
    singles = [row for row in rows.values() if kinds[row.strategy] is Kind.SINGLE]
    best = min(
        singles,
        key=lambda row: (-row.mean_accuracy, row.mean_cost_per_question_usd, row.strategy),
        default=None,
    )
    if best is not None:
        for name, row in rows.items():
            differences = [
                [items[i].value - theirs[i].value for i in items if i in theirs]
                for items, theirs in zip(scored[name], scored[best.strategy], strict=True)
            ]
            row.paired_items = sum(map(len, differences))
            if all(differences):
                row.minus_best_single = _mean([_mean(d) for d in differences])
                row.minus_best_single_ci95 = bootstrap_mean_of_means(differences)
    return SuiteMean(
        suites=suites,
        best_single=best.strategy if best else None,
        strategies=sorted(
            rows.values(),
            key=lambda row: (-row.mean_accuracy, row.mean_cost_per_question_usd, row.strategy),
        ),
        left_out=left_out,
        bootstrap=f"{BOOTSTRAP:,} resamples of each suite's items within the suite (seed "
        f"{BOOTSTRAP_SEED}), 2.5th to 97.5th percentile",
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def routing(
    results: Sequence[ItemResult], summary: dict[str, list[StrategyRow]], workers: Sequence[str]
) -> dict[str, list[RoutingRow]]:
    """Per suite, in the summary's order, how each strategy's plans used ``workers``."""
    grouped: dict[tuple[str, str], list[ItemResult]] = defaultdict(list)
    for r in results:
        if r.status == UNRECORDED:
            continue  # left out of the figures, as in the summary
        grouped[(r.suite, r.strategy)].append(r)
        grouped[(ALL_SUITES, r.strategy)].append(r)  # read only when the summary pools
    table: dict[str, list[RoutingRow]] = {}
    for suite, rows in summary.items():
        table[suite] = []
        for row in rows:
            runs = grouped.get((suite, row.strategy), [])
            if not runs:
                continue  # the oracle: made of other strategies' runs
            n = len(runs)
            table[suite].append(
                RoutingRow(
                    strategy=row.strategy,
                    n=n,
                    worker_share={w: sum(w in r.workers for r in runs) / n for w in workers},
                    plans_by_steps=dict(sorted(Counter(r.steps for r in runs).items())),
                    sees_earlier_share=sum(any(r.sees) for r in runs) / n,
                )
            )
    return table


def _row(name: str, kind: Kind, runs: list[ItemResult]) -> StrategyRow:
    rows = [r for r in runs if r.status != UNRECORDED]
    n = len(rows)
    score = sum(r.value for r in rows)
    latencies = [r.latency_ms / 1000 for r in rows]
    valid = [r.plan_valid for r in rows if r.plan_valid is not None]
    return StrategyRow(
        strategy=name,
        kind=kind.value,
        n=n,
        correct=sum(r.correct for r in rows),
        accuracy=score / n if n else 0.0,
        ci95=wilson(score, n),
        tokens_per_question=sum(r.tokens for r in rows) / n if n else 0.0,
        cost_per_question_usd=sum(r.cost_usd for r in rows) / n if n else 0.0,
        steps_per_question=sum(r.steps for r in rows) / n if n else 0.0,
        latency_p50_s=percentile(latencies, 0.5),
        latency_p95_s=percentile(latencies, 0.95),
        failed=sum(r.status != "completed" for r in rows),
        plan_valid_rate=sum(valid) / len(valid) if valid else None,
        mean_reward=(
            sum(method_reward(valid=r.plan_valid is not False, correct=r.correct) for r in rows) / n
            if n
            else 0.0
        ),
        unrecorded=len(runs) - n,
    )


def render_markdown(
    summary: dict[str, list[StrategyRow]],
    meta: dict[str, Any],
    plot_file: str | None,
    routed: dict[str, list[RoutingRow]],
    means: SuiteMean | None = None,
) -> str:
    lines = ["# Conductor evaluation", ""]
    simulated = meta.get("simulated_workers") or []
    if simulated:
        lines += [
            f"> **Simulated workers**: {', '.join(simulated)} are the `sim` provider, a "
            "simulator that answers right with configured per-domain probabilities, lower on "
            "harder items, not LLMs. These figures measure orchestration on that simulator, not "
            "model quality.",
            "",
        ]
    replayed = meta.get("replay_workers") or []
    if replayed:
        lines += [
            f"> **Replayed workers**: {', '.join(replayed)} are the `replay` provider: they "
            "answer with what real LLMs answered, as recorded in an outcome table, at the "
            "recorded cost, tokens and latency where recorded, and are not called. A workflow "
            "is judged by the recorded score of the worker whose answer is final, not by a "
            "verifier. No outcome "
            "was recorded for a worker shown other answers, so a step that checks or aggregates "
            "earlier answers gains nothing from them: the figures of multi-step plans (MoA, "
            "reflect, the Conductor's) are a lower bound. A question on which a workflow called "
            "a worker without a recorded score is left out of that strategy's figures (not "
            "recorded is not wrong; the `not recorded` column counts them).",
            "",
        ]
    lines += [
        f"- Pool: {meta['pool_label']} ({', '.join(meta['workers'])})",
        f"- Conductor: {meta['planner']}",
        f"- Items per suite: at most {meta['limit']} (seed {meta['seed']})"
        + (
            ", from the held-out share training never sees (an outcome table's own test split "
            "where it has one)"
            if meta.get("held_out")
            else ""
        ),
        f"- Generated: {meta['generated_at']}",
        f"- Command: `{meta['command']}`",
        "",
    ]
    for suite, rows in summary.items():
        unrecorded = any(r.unrecorded for r in rows)
        lines += [
            f"## {suite}",
            "",
            "| strategy | accuracy | 95% CI | n | tokens/q | cost/q (USD) | steps/q "
            "| latency p50 (s) | p95 (s) | failed | plan valid | reward |"
            + (" not recorded |" if unrecorded else ""),
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            + ("---:|" if unrecorded else ""),
        ]
        for r in rows:
            valid = "" if r.plan_valid_rate is None else f"{r.plan_valid_rate:.0%}"
            lines.append(
                f"| {r.strategy} | {r.accuracy:.1%} | {r.ci95[0]:.1%} - {r.ci95[1]:.1%} | {r.n} "
                f"| {r.tokens_per_question:,.0f} | {r.cost_per_question_usd:.6f} "
                f"| {r.steps_per_question:.2f} | {r.latency_p50_s:.2f} | {r.latency_p95_s:.2f} "
                f"| {r.failed} | {valid} | {r.mean_reward:.3f} |"
                + (f" {r.unrecorded} |" if unrecorded else "")
            )
        lines.append("")
        lines += _routing_markdown(routed.get(suite, []), meta["workers"])
    if means is not None:
        lines += _suite_mean_markdown(means)
    lines += [
        "Accuracy is the mean score of the items: 1 when the suite's verifier accepts the "
        "final answer, else 0 (a workflow that failed counts 0); on an outcome table's "
        "questions, the recorded score of the worker whose answer is final (between 0 and 1 "
        "where its source scored a share of sampled answers). The oracle is, per item, the "
        "single worker with the highest score, the cheapest among equals (an upper bound for "
        "routing, not a strategy one can run). "
        "Reward is the method's training reward, averaged: 0 for a Conductor plan that does not "
        "parse or validate, 0.5 for a wrong answer, 1 for a right one. An invalid plan is "
        "replaced by one step on worker 0, so it can be right and still earn 0.",
        "",
    ]
    if plot_file:
        lines += [f"![accuracy against cost]({plot_file})", ""]
    return "\n".join(lines)


def _suite_mean_markdown(means: SuiteMean) -> list[str]:
    best = means.best_single
    lines = [
        "## Mean over suites",
        "",
        f"Over {', '.join(means.suites)}: a strategy's accuracy is the unweighted mean of its "
        "accuracies on the suites (each suite counts the same, whatever its number of items), "
        "and so is its cost per question. "
        + (
            f"Minus best single is its margin over {best}, the single worker with the highest "
            "mean, in percentage points, paired: per suite over the items both scored, then "
            "averaged (where either left items out as not recorded, it can differ from the "
            "difference of the two means). "
            if best
            else "No single worker was scored on every suite, so there is no best single. "
        )
        + f"95% intervals by bootstrap: {means.bootstrap}; the oracle is per item the best "
        "single worker, as above.",
        "",
        "| strategy | mean accuracy | 95% CI | minus best single, points (95% CI) | cost/q (USD) |",
        "|---|---:|---|---:|---:|",
    ]
    for r in means.strategies:
        margin = ""
        if r.minus_best_single is not None and r.minus_best_single_ci95 is not None:
            low, high = r.minus_best_single_ci95
            margin = f"{points(r.minus_best_single)} ({points(low)} to {points(high)})"
        lines.append(
            f"| {r.strategy} | {r.mean_accuracy:.1%} | {r.ci95[0]:.1%} - {r.ci95[1]:.1%} "
            f"| {margin} | {r.mean_cost_per_question_usd:.6f} |"
        )
    lines.append("")
    if means.left_out:
        missing = "; ".join(f"{name} ({', '.join(s)})" for name, s in means.left_out.items())
        lines += [f"Left out, not scored on every suite (the suites it lacks): {missing}.", ""]
    return lines


def points(share: float) -> str:
    """A difference of accuracies in percentage points, signed."""
    return f"{100 * share:+.1f}"


def _routing_markdown(rows: list[RoutingRow], workers: Sequence[str]) -> list[str]:
    if not rows:
        return []
    lines = [
        "How each strategy routed: the share of questions each worker worked on, plans by "
        "number of steps, and the share of plans where a step saw an earlier step's output.",
        "",
        "| strategy | " + " | ".join(workers) + " | plans by steps | sees an earlier step |",
        "|---|" + "---:|" * len(workers) + "---|---:|",
    ]
    for r in rows:
        shares = " | ".join(f"{r.worker_share.get(w, 0.0):.0%}" for w in workers)
        steps = ", ".join(f"{k}: {v}" for k, v in r.plans_by_steps.items())
        lines.append(f"| {r.strategy} | {shares} | {steps} | {r.sees_earlier_share:.0%} |")
    return [*lines, ""]


def report_json(
    summary: dict[str, list[StrategyRow]],
    meta: dict[str, Any],
    routed: dict[str, list[RoutingRow]],
    means: SuiteMean | None = None,
) -> dict[str, Any]:
    document = {
        **meta,
        "suites": {
            suite: [row.model_dump(mode="json") for row in rows] for suite, rows in summary.items()
        },
        "routing": {
            suite: [row.model_dump(mode="json") for row in rows] for suite, rows in routed.items()
        },
    }
    if means is not None:
        document["suite_mean"] = means.model_dump(mode="json")
    return document
