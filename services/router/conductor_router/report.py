"""Judging routers on held-out questions, from arrays: each router swept over cost weights
gives its accuracy/cost curve, against what a router has to beat: each worker alone, a random
pick, and the oracle (per question the cheapest worker that was right: an upper bound).

The area under a curve (accuracy integrated over cost up to the dearest worker's, divided by
that cost) compares routers over the whole curve, with bootstrap intervals over the held-out
questions. Routers are compared on the held-out questions every worker ran; when there are none
(traces alone: one worker per question), the report says that they could not be judged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from conductor_router.model import PER_QUESTIONS
from conductor_router.serving import Router

BOOTSTRAP = 300  # resamples of the held-out items for the confidence intervals
# Cost weights swept for the curves: 0 (accuracy only), then up to where the cheapest worker wins.
# 0 (accuracy only), then up to where the cheapest worker wins; dense enough that a budget (a
# share of the best single worker's cost) finds a point near it.
COST_WEIGHTS = (0.0, *np.geomspace(0.0001, 5.0, 60).round(6).tolist())
# Budgets the report reads each curve at: shares of the most accurate single worker's cost.
BUDGETS = (1.0, 0.6, 0.25)
NOT_JUDGED = (
    "no held-out item was run by every worker, so no router could be judged against the others "
    "(a traced workflow says how one worker did): the router is fitted all the same. To judge "
    "it, evaluate the pool with `conductor eval --strategies 'single:*'` and train on that too."
)


@dataclass
class Curve:
    """A router's accuracy and cost per question on the held-out items, per cost weight."""

    name: str
    points: list[dict[str, float]] = field(default_factory=list)  # cost_weight, accuracy, cost

    def area(self, max_cost: float) -> float:
        return curve_area([(p["cost_usd"], p["accuracy"]) for p in self.points], max_cost)


def curve_area(points: Sequence[tuple[float, float]], max_cost: float) -> float:
    """Accuracy integrated over cost from 0 to ``max_cost`` (divided by it), taking at each cost
    the best accuracy reached at that cost or less (a router can always spend less)."""
    if max_cost <= 0:
        return 0.0
    area, best, previous = 0.0, 0.0, 0.0
    for cost, accuracy in sorted(points):
        cost = min(cost, max_cost)
        area += (cost - previous) * best
        best, previous = max(best, accuracy), cost
    return (area + (max_cost - previous) * best) / max_cost


def held_out_report(
    questions: Sequence[str],
    embeddings: npt.NDArray[np.float32],
    *,
    workers: Sequence[str],
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    held: npt.NDArray[np.bool_],
    routers: dict[str, Router],
) -> dict[str, Any]:
    """Held-out accuracy and cost of each single worker, random, the oracle, and the curve of
    each router (``router``, ``knn``, ``cluster``: the first is the one the others are compared
    with), each choosing as ``Router.choose`` does with every worker allowed. ``right`` and
    ``cost`` are (questions, workers), NaN where a worker did not run; ``held`` marks the
    held-out questions."""
    workers = list(workers)
    # Held-out items every worker ran: each router is judged on the same questions.
    complete = held & ~np.isnan(right).any(axis=1)
    right, cost = right[complete], cost[complete]
    n = int(complete.sum())
    partial = int(held.sum()) - n  # held-out items some worker did not run: not judged
    if n == 0:
        return {
            "held_out_items": 0,
            "held_out_partial_items": partial,
            "workers": workers,
            "note": NOT_JUDGED,
        }
    held_embeddings = embeddings[complete]
    held_questions = [q for q, kept in zip(questions, complete, strict=True) if kept]
    picks: dict[str, npt.NDArray[np.int_]] = {}  # per router: (cost weights, items)
    curves = []
    for name, router in routers.items():
        column = np.array([workers.index(worker) for worker in router.names])
        p_right, expected_cost = router.estimate(held_embeddings, held_questions)
        curve = Curve(name)
        chosen = []
        for weight in COST_WEIGHTS:
            pick = column[router.picks(p_right, expected_cost, weight)]
            chosen.append(pick)
            curve.points.append({"cost_weight": weight, **_point(right, cost, pick)})
        picks[name] = np.array(chosen)
        curves.append(curve)
    first = curves[0].name
    singles: dict[str, dict[str, Any]] = {
        worker: _point(right, cost, np.full(n, j)) for j, worker in enumerate(workers)
    }
    rng = random.Random(0)
    random_pick = np.array([rng.randrange(len(workers)) for _ in range(n)])
    # The oracle: the cheapest worker that was right, else the cheapest.
    oracle = np.array(
        [
            min(
                range(len(workers)),
                key=lambda j, i=i: (-right[i, j], cost[i, j]),  # type: ignore[misc]
            )
            for i in range(n)
        ]
    )
    max_cost = max(s["cost_usd"] for s in singles.values())
    areas = _bootstrap_areas(right, cost, picks, max_cost)
    for j, worker in enumerate(workers):
        singles[worker]["accuracy_ci"] = _bootstrap_accuracy(right[:, j])
    return {
        "held_out_items": n,
        "held_out_partial_items": partial,
        "workers": workers,
        "cost_per": f"USD per question (cost_weight: chance given up per USD per {PER_QUESTIONS})",
        "single": singles,
        "random": _point(right, cost, random_pick),
        "oracle": _point(right, cost, oracle),
        "curves": [
            {
                "name": c.name,
                "area": round(c.area(max_cost), 4),
                "area_ci": _interval(areas[c.name]),
                # Paired over the same resampled items: above 0 means the router is ahead.
                "router_minus_this_ci": _interval(areas[first] - areas[c.name]),
                "budgets": _budget_points(c, picks[c.name], right, cost, singles),
                "points": c.points,
            }
            for c in curves
        ],
        "bootstrap": f"{BOOTSTRAP} resamples of the held-out items, 95% intervals",
        "max_cost_usd": max_cost,
    }


def best_single(singles: dict[str, dict[str, Any]]) -> str:
    """The most accurate single worker (the cheaper among equals)."""
    return max(singles, key=lambda w: (singles[w]["accuracy"], -singles[w]["cost_usd"]))


def _budget_points(
    curve: Curve,
    chosen: npt.NDArray[np.int_],
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    singles: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """Per budget (a share of the most accurate single worker's cost), the curve's most
    accurate point within it and its accuracy minus that worker's, with a paired bootstrap
    interval over the held-out items (above 0: ahead of it)."""
    reference = best_single(singles)
    column = list(singles).index(reference)
    out: list[dict[str, Any]] = []
    for share in BUDGETS:
        limit = share * singles[reference]["cost_usd"]
        within = [i for i, p in enumerate(curve.points) if p["cost_usd"] <= limit]
        if not within:
            out.append({"share_of_best_single_cost": share, "point": None})
            continue
        best = max(
            within, key=lambda i: (curve.points[i]["accuracy"], -curve.points[i]["cost_usd"])
        )
        rows = np.arange(len(right))
        difference = right[rows, chosen[best]] - right[:, column]
        reference_cost = singles[reference]["cost_usd"]
        out.append(
            {
                "share_of_best_single_cost": share,
                "best_single": reference,
                "point": curve.points[best],
                # None where the best single worker costs nothing (a share of 0 is undefined).
                "cost_share": curve.points[best]["cost_usd"] / reference_cost
                if reference_cost > 0
                else None,
                "minus_best_single": float(difference.mean()),
                "minus_best_single_ci": _bootstrap_mean(difference),
            }
        )
    return out


def _bootstrap_mean(values: npt.NDArray[np.float64]) -> list[float]:
    rng = np.random.default_rng(0)
    samples = rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))
    return _interval(values[samples].mean(axis=1))


def _interval(values: npt.NDArray[np.float64]) -> list[float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def _bootstrap_accuracy(right: npt.NDArray[np.float64]) -> list[float]:
    return _bootstrap_mean(right)


def _bootstrap_areas(
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    picks: dict[str, npt.NDArray[np.int_]],
    max_cost: float,
) -> dict[str, npt.NDArray[np.float64]]:
    """Each router's curve area on ``BOOTSTRAP`` resamples of the held-out items (the same
    resamples for every router, so their differences are paired)."""
    rng = np.random.default_rng(0)
    n = right.shape[0]
    samples = rng.integers(0, n, size=(BOOTSTRAP, n))
    areas: dict[str, npt.NDArray[np.float64]] = {}
    for name, chosen in picks.items():  # chosen: (weights, items)
        got = np.take_along_axis(right, chosen.T, axis=1).T  # (weights, items)
        spent = np.take_along_axis(cost, chosen.T, axis=1).T
        areas[name] = np.array(
            [
                curve_area(
                    list(zip(spent[:, s].mean(axis=1), got[:, s].mean(axis=1), strict=True)),
                    max_cost,
                )
                for s in samples
            ]
        )
    return areas


def _point(
    right: npt.NDArray[np.float64], cost: npt.NDArray[np.float64], pick: npt.NDArray[np.int_]
) -> dict[str, float]:
    rows = np.arange(len(pick))
    return {
        "accuracy": float(right[rows, pick].mean()),
        "cost_usd": float(cost[rows, pick].mean()),
        "correct": float(right[rows, pick].sum()),
    }
