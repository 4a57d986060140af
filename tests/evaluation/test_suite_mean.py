"""The mean over suites: each suite counts the same, with bootstrap intervals drawn within each
suite, and every strategy's margin over the best single worker, paired item by item.

Results are made by hand, small enough to check every figure by hand.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from conductor.pool import Pool
from conductor_adapters.settings import Settings
from conductor_cli.eval import _print_summary
from conductor_cli.wiring import open_eval_runtime
from conductor_evaluation.harness import EvalOptions, evaluate
from conductor_evaluation.report import (
    ALL_SUITES,
    BOOTSTRAP,
    bootstrap_mean_of_means,
    render_markdown,
    report_json,
    suite_mean,
    summarize,
)
from conductor_evaluation.results import UNRECORDED, ItemResult
from conductor_evaluation.strategies import Kind, Strategy

A, B, C = "single:a", "single:b", "single:c"
STRATEGIES = [
    Strategy(A, Kind.SINGLE, ("a",)),
    Strategy(B, Kind.SINGLE, ("b",)),
    Strategy(C, Kind.SINGLE, ("c",)),
    Strategy("random", Kind.RANDOM),
    Strategy("moa", Kind.MOA, ("a", "b", "c")),
]


def result(
    suite: str, item: str, strategy: str, score: float | None, cost: float = 0.0
) -> ItemResult:
    """A verifier's verdict where ``score`` is 0 or 1 (its score then None, as the harness
    writes it), else a recorded score; None: not recorded."""
    if score is None:
        return ItemResult(
            suite=suite, item_id=item, strategy=strategy, correct=False, status=UNRECORDED
        )
    verdict = score in (0, 1)
    return ItemResult(
        suite=suite,
        item_id=item,
        strategy=strategy,
        correct=score >= 0.5,
        status="completed",
        score=None if verdict else score,
        cost_usd=cost,
    )


def scores(
    suite: str, strategy: str, values: Sequence[float | None], cost: float
) -> list[ItemResult]:
    return [result(suite, str(i), strategy, v, cost) for i, v in enumerate(values)]


def by_name(results: list[ItemResult], strategies: list[Strategy] = STRATEGIES) -> dict[str, Any]:
    means = suite_mean(results, strategies)
    assert means is not None
    return {row.strategy: row for row in means.strategies}


# Suite "big" has 8 items, "small" 2. a is right on 6 of big's, 0 of small's; b on 2 and 2.
# Pooled, a leads (6/10 against 4/10); each suite counted the same, b does: (0.25 + 1) / 2.
RESULTS = [
    *scores("big", A, [1, 1, 1, 1, 1, 1, 0, 0], 0.01),
    *scores("big", B, [1, 1, 0, 0, 0, 0, 0, 0], 0.001),
    *scores("big", C, [0, 0, 0, 0, 0, 0, 0, 0], 0.0),
    *scores("small", A, [0, 0], 0.03),
    *scores("small", B, [1, 1], 0.003),
    *scores("small", C, [0, 0], 0.0),
]


def test_the_mean_weighs_each_suite_the_same_and_names_the_best_single_worker() -> None:
    means = suite_mean(RESULTS, STRATEGIES)
    assert means is not None
    assert means.suites == ["big", "small"]
    rows = {row.strategy: row for row in means.strategies}
    assert rows[A].mean_accuracy == pytest.approx((6 / 8 + 0) / 2)
    assert rows[B].mean_accuracy == pytest.approx((2 / 8 + 1) / 2)
    assert rows[C].mean_accuracy == 0
    assert rows[A].mean_cost_per_question_usd == pytest.approx((0.01 + 0.03) / 2)
    assert [row.strategy for row in means.strategies] == [B, A, C]
    assert means.best_single == B
    # Pooled, a is ahead: the "all suites" row is unchanged, items weighted alike.
    summary = summarize(RESULTS, STRATEGIES)
    pooled = {row.strategy: row.accuracy for row in summary[ALL_SUITES]}
    assert pooled[A] == pytest.approx(0.6)
    assert pooled[B] == pytest.approx(0.4)
    # The mean is of the accuracies the per-suite rows give.
    for name, row in rows.items():
        per_suite = [r.accuracy for s in ("big", "small") for r in summary[s] if r.strategy == name]
        assert row.mean_accuracy == pytest.approx(sum(per_suite) / 2)
        low, high = row.ci95
        assert low <= row.mean_accuracy <= high
    # c is wrong everywhere: no resample can move it.
    assert rows[C].ci95 == (0.0, 0.0)
    assert rows[B].minus_best_single == 0
    assert rows[B].minus_best_single_ci95 == (0.0, 0.0)
    assert rows[A].minus_best_single == pytest.approx((4 / 8 - 1) / 2)
    assert rows[A].paired_items == 10
    assert means.left_out == {}
    assert "1,000 resamples" in means.bootstrap
    assert BOOTSTRAP == 1000


def test_three_suites_and_the_best_single_worker_among_them() -> None:
    results = [
        *RESULTS,
        *scores("third", A, [1, 1, 1, 1], 0.01),
        *scores("third", B, [0, 0, 0, 1], 0.001),
        *scores("third", C, [1, 0, 0, 0], 0.0),
    ]
    rows = by_name(results)
    # a: (0.75 + 0 + 1) / 3; b: (0.25 + 1 + 0.25) / 3; c: (0 + 0 + 0.25) / 3.
    assert rows[A].mean_accuracy == pytest.approx(1.75 / 3)
    assert rows[B].mean_accuracy == pytest.approx(1.5 / 3)
    assert rows[C].mean_accuracy == pytest.approx(0.25 / 3)
    means = suite_mean(results, STRATEGIES)
    assert means is not None
    assert means.best_single == A
    assert rows[B].minus_best_single == pytest.approx(-0.25 / 3)


def test_a_strategy_ahead_on_every_item_is_ahead_and_an_identical_one_is_not() -> None:
    best = [0.0, 0.5, 0.25, 0.0, 0.5]
    results = [
        *scores("s1", A, best, 0.01),
        *scores("s2", A, best[:3], 0.01),
        # random: a's scores; moa: a's and a quarter more on every item.
        *scores("s1", "random", best, 0.01),
        *scores("s2", "random", best[:3], 0.01),
        *scores("s1", "moa", [v + 0.25 for v in best], 0.04),
        *scores("s2", "moa", [v + 0.25 for v in best[:3]], 0.04),
    ]
    rows = by_name(results)
    assert rows["random"].minus_best_single == 0
    assert rows["random"].minus_best_single_ci95 == (0.0, 0.0)
    assert rows["moa"].minus_best_single == pytest.approx(0.25)
    low, high = rows["moa"].minus_best_single_ci95
    assert low == pytest.approx(0.25)
    assert high == pytest.approx(0.25)
    # Ahead by a margin that varies item by item: the interval lies above zero, around it.
    ahead = [0.5, 0.1, 0.75, 1.0, 0.25]
    uneven = [
        *[r for r in results if r.strategy != "moa"],
        *scores("s1", "moa", [v + d for v, d in zip(best, ahead, strict=True)], 0.04),
        *scores("s2", "moa", [v + d for v, d in zip(best[:3], ahead[:3], strict=True)], 0.04),
    ]
    moa = by_name(uneven)["moa"]
    low, high = moa.minus_best_single_ci95
    assert 0 < low < moa.minus_best_single < high


def test_fractional_and_unrecorded_scores() -> None:
    results = [
        *scores("s1", A, [0.5, 0.25, 1.0], 0.01),
        *scores("s2", A, [0.75, None], 0.01),  # not recorded: out of a's figures
        *scores("s1", B, [0.5, 0.5, 0.5], 0.002),
        *scores("s2", B, [0.0, 1.0], 0.002),
    ]
    rows = by_name(results)
    assert rows[A].mean_accuracy == pytest.approx(((0.5 + 0.25 + 1.0) / 3 + 0.75) / 2)
    assert rows[B].mean_accuracy == pytest.approx((0.5 + 0.5) / 2)
    # Paired over the items both scored: s2's item 1 only b scored.
    assert rows[B].paired_items == 4
    assert rows[B].minus_best_single == pytest.approx(((0 + 0.25 - 0.5) / 3 + (0.0 - 0.75)) / 2)


def test_a_strategy_missing_from_a_suite_is_left_out() -> None:
    results = [
        *RESULTS,
        *scores("big", "moa", [1] * 8, 0.05),  # never ran on "small"
        *scores("big", "random", [1] * 8, 0.01),
        *scores("small", "random", [None, None], 0.0),  # ran, but nothing recorded
    ]
    means = suite_mean(results, STRATEGIES)
    assert means is not None
    assert {row.strategy for row in means.strategies} == {A, B, C}
    assert means.left_out == {"moa": ["small"], "random": ["small"]}
    markdown = render_markdown(summarize(results, STRATEGIES), META, None, {}, means)
    assert "Left out, not scored on every suite (the suites it lacks): moa (small); " in markdown


def test_no_single_worker_on_every_suite_and_one_suite() -> None:
    results = [*scores("s1", A, [1], 0.0), *scores("s1", "moa", [1], 0.0)]
    results += scores("s2", "moa", [0], 0.0)
    means = suite_mean(results, STRATEGIES)
    assert means is not None
    assert means.best_single is None
    assert means.strategies[0].minus_best_single is None
    assert suite_mean(RESULTS[:24], STRATEGIES) is None  # "big" alone: no mean over suites


def test_the_bootstrap_resamples_within_each_suite_and_is_reproducible() -> None:
    # Drawn from the two suites pooled, a resample could hold more ones than zeros; drawn
    # within each, every mean of means is (0 + 1) / 2.
    assert bootstrap_mean_of_means([[0.0] * 5, [1.0] * 3]) == (0.5, 0.5)
    groups = [[0.0, 1.0, 1.0, 0.5], [1.0, 0.0]]
    low, high = bootstrap_mean_of_means(groups)
    assert 0 <= low < 0.5625 < high <= 1
    assert bootstrap_mean_of_means(groups) == (low, high)
    # The order in which results were written does not change the intervals.
    shuffled = [*reversed(RESULTS[:24]), *reversed(RESULTS[24:])]
    assert suite_mean(RESULTS, STRATEGIES) == suite_mean(shuffled, STRATEGIES)


META: dict[str, Any] = {
    "pool_label": "test",
    "workers": ["a", "b", "c"],
    "planner": "not evaluated",
    "limit": 10,
    "seed": 0,
    "generated_at": "now",
    "command": "conductor eval",
}


def test_the_report_has_the_section_and_one_suite_none() -> None:
    summary = summarize(RESULTS, STRATEGIES)
    means = suite_mean(RESULTS, STRATEGIES)
    markdown = render_markdown(summary, META, None, {}, means)
    assert "## Mean over suites" in markdown
    assert "the single worker with the highest mean" in markdown
    assert "| single:b | 62.5% |" in markdown
    assert "| +0.0 (+0.0 to +0.0) | 0.002000 |" in markdown
    assert "| single:c | 33.3%" not in markdown  # c: 0.0%
    document = report_json(summary, META, {}, means)
    assert document["suite_mean"]["best_single"] == B
    assert set(document["suite_mean"]["strategies"][0]) >= {
        "mean_accuracy",
        "ci95",
        "mean_cost_per_question_usd",
        "minus_best_single",
        "minus_best_single_ci95",
    }
    # Without the mean (one suite), the report is as before.
    one = summarize(RESULTS[:24], STRATEGIES)
    assert "Mean over suites" not in render_markdown(one, META, None, {})
    assert "suite_mean" not in report_json(one, META, {})


# -- conductor eval end to end, on a replay pool ---------------------------------------------


def outcome(score: float | None, cost: float) -> dict[str, Any]:
    return {"score": score, "cost_usd": cost}


def row(item: str, domain: str, big: float | None, small: float | None) -> dict[str, Any]:
    return {
        "id": item,
        "question": f"Question {item}?",
        "domain": domain,
        "split": "test",
        "outcomes": {"big": outcome(big, 0.01), "small": outcome(small, 0.001)},
    }


# Domain a (5 questions): big right on four, small on half of one (a5 not recorded); domain b
# (2): small right on both. Pooled, big leads (4/7); each domain counted the same, small does.
TABLE = [
    row("a1", "a", 1, 0),
    row("a2", "a", 1, 0),
    row("a3", "a", 1, 0),
    row("a4", "a", 1, 0.5),
    row("a5", "a", 0, None),
    row("b1", "b", 0, 1),
    row("b2", "b", 0, 1),
]


async def test_conductor_eval_reports_the_mean_over_a_tables_domains(tmp_path: Path) -> None:
    table = tmp_path / "table.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in TABLE), encoding="utf-8")
    suites = [f"table:{table}#a", f"table:{table}#b"]
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}")

    def open_runtime(pool: Pool, with_planner: bool, step_timeout_s: float) -> Any:
        return open_eval_runtime(
            settings, pool, with_planner=with_planner, step_timeout_s=step_timeout_s
        )

    options = EvalOptions(
        suites=suites,
        limit=10,
        strategies="single:*,random,oracle",
        pool=f"replay:{table}",
        out=tmp_path / "out",
    )
    outcome_ = await evaluate(options, settings, open_runtime)
    report = json.loads(outcome_.report_json.read_text())
    means = report["suite_mean"]
    assert means["suites"] == suites
    assert means["best_single"] == "single:small"
    rows = {r["strategy"]: r for r in means["strategies"]}
    assert set(rows) == {"single:big", "single:small", "random", "oracle"}
    assert rows["single:big"]["mean_accuracy"] == pytest.approx((4 / 5 + 0) / 2)
    assert rows["single:small"]["mean_accuracy"] == pytest.approx((0.5 / 4 + 1) / 2)
    assert rows["single:big"]["mean_cost_per_question_usd"] == pytest.approx(0.01)
    # The oracle: big on a1-a5 (a5: only big recorded), small on b1-b2.
    assert rows["oracle"]["mean_accuracy"] == pytest.approx((4 / 5 + 1) / 2)
    assert rows["oracle"]["mean_cost_per_question_usd"] == pytest.approx((0.01 + 0.001) / 2)
    # Paired with small over the items both scored (not a5): a1-a4 ahead by 1, 1, 1, 0.5.
    assert rows["oracle"]["paired_items"] == 6
    assert rows["oracle"]["minus_best_single"] == pytest.approx((3.5 / 4 + 0) / 2)
    low, high = rows["oracle"]["minus_best_single_ci95"]
    assert 0 < low <= high
    assert rows["single:small"]["minus_best_single_ci95"] == [0.0, 0.0]
    per_suite = {s: {r["strategy"]: r["accuracy"] for r in report["suites"][s]} for s in suites}
    assert rows["random"]["mean_accuracy"] == pytest.approx(
        sum(per_suite[s]["random"] for s in suites) / 2
    )
    # The pooled row is as it was: big ahead, items weighted alike.
    pooled = {r["strategy"]: r["accuracy"] for r in report["suites"][ALL_SUITES]}
    assert pooled["single:big"] == pytest.approx(4 / 7)
    assert pooled["single:small"] == pytest.approx(2.5 / 6)

    markdown = outcome_.report_md.read_text()
    assert "## Mean over suites" in markdown
    assert "| oracle | 90.0% |" in markdown
    assert "its margin over single:small" in markdown

    printed = io.StringIO()
    _print_summary(Console(file=printed, width=200, highlight=False), outcome_.summary)
    text = printed.getvalue()
    assert "mean over 2 suites" in text
    assert "single:small" in text.split("mean over 2 suites")[1]
    assert "+0.0 (+0.0 to +0.0)" in text
