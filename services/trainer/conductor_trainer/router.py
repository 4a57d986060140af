"""Training conductor-mini's router from ``conductor eval`` results, and the report that says
whether it learned anything.

The data: every item an evaluation ran with ``single:NAME`` strategies gives, per worker, right
or wrong and what it cost. The router learns on the items outside the held-out split (the same
split by item key as ``conductor train`` and ``conductor eval --held-out``) and is judged on the
held-out ones, against what a router has to beat: each worker alone, a random pick, the oracle
(per item the cheapest worker that was right: an upper bound), and two baselines fitted on the
same embeddings and items: ``knn`` (the best worker of the 15 nearest training questions) and
``cluster`` (k-means on the embeddings, the best worker of each cluster, as Avengers-Pro does).
Every router is swept over cost weights, giving its accuracy/cost curve; the area under it
(accuracy integrated over cost up to the dearest worker's, divided by that cost) compares
routers over the whole curve.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from conductor.errors import ConfigurationError
from conductor_adapters.embedding import QuestionEmbedder
from conductor_adapters.router import PER_QUESTIONS, Router, RouterModel, WorkerHead
from conductor_evaluation import EvalItem, ItemResult, ResultStore, is_held_out, load_suite

SINGLE = "single:"
KNN_NEIGHBOURS = 15
CLUSTERS = 20
# Cost weights swept for the curves: 0 (accuracy only), then up to where the cheapest worker wins.
COST_WEIGHTS = (0.0, *np.geomspace(0.001, 2.0, 24).round(5).tolist())

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class RoutingData:
    """Items with, per worker, right (1.0), wrong (0.0) or not run (nan), and the cost."""

    items: list[EvalItem]
    workers: list[str]
    right: npt.NDArray[np.float64]  # (items, workers)
    cost: npt.NDArray[np.float64]  # (items, workers), USD per question

    @property
    def held_out(self) -> npt.NDArray[np.bool_]:
        return np.array([is_held_out(item) for item in self.items])


def routing_data(eval_dir: Path) -> RoutingData:
    """The ``single:*`` results of an evaluation directory, with their items."""
    results = [r for r in ResultStore(eval_dir).load() if r.strategy.startswith(SINGLE)]
    if not results:
        raise ConfigurationError(
            f"{eval_dir}: no single-worker results to learn from; run `conductor eval "
            f"--strategies 'single:*' --out {eval_dir}` first"
        )
    workers = sorted({r.strategy.removeprefix(SINGLE) for r in results})
    by_item: dict[tuple[str, str], dict[str, ItemResult]] = {}
    for r in results:
        by_item.setdefault((r.suite, r.item_id), {})[r.strategy.removeprefix(SINGLE)] = r
    items = _items(eval_dir, sorted({suite for suite, _ in by_item}), set(by_item))
    right = np.full((len(items), len(workers)), np.nan)
    cost = np.full((len(items), len(workers)), np.nan)
    for i, item in enumerate(items):
        for j, worker in enumerate(workers):
            found = by_item[(item.suite, item.id)].get(worker)
            if found is not None and found.status != "error":
                right[i, j] = float(found.correct)
                cost[i, j] = found.cost_usd
    return RoutingData(items, workers, right, cost)


def _items(eval_dir: Path, suites: list[str], keys: set[tuple[str, str]]) -> list[EvalItem]:
    items: list[EvalItem] = []
    for suite in suites:
        try:
            loaded = load_suite(suite)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{eval_dir}: its suite {suite} cannot be loaded: {exc}"
            ) from exc
        items += [item for item in loaded if (item.suite, item.id) in keys]
    if not items:
        raise ConfigurationError(f"{eval_dir}: none of its items are in the suites named")
    return items


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


def train_router(
    data: RoutingData,
    embedder: QuestionEmbedder,
    *,
    cost_weight: float = 0.0,
    progress: Progress | None = None,
) -> tuple[RouterModel, dict[str, Any]]:
    """The router (one logistic head per worker, fitted on the training items) and its report
    on the held-out items."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]

    notify = progress or (lambda stage, done, total: None)
    embeddings = _embed(embedder, [item.question for item in data.items], notify)
    held = data.held_out
    if held.all() or not held.any():
        raise ConfigurationError(
            "the evaluation's items fall all on one side of the held-out split: evaluate more "
            "items (--limit) so that both training and held-out items exist"
        )
    heads = []
    for j, worker in enumerate(data.workers):
        notify("fitting", j, len(data.workers))
        known = ~held & ~np.isnan(data.right[:, j])
        labels = data.right[known, j]
        if len(labels) == 0:
            raise ConfigurationError(f"worker {worker} has no training results")
        if labels.min() == labels.max():  # always right or always wrong: a constant head
            rate = min(max(labels.mean(), 0.01), 0.99)
            coef, intercept = [0.0] * embedder.dim, math.log(rate / (1 - rate))
        else:
            fitted = LogisticRegression(C=1.0, max_iter=2000).fit(embeddings[known], labels)
            coef, intercept = fitted.coef_[0].tolist(), float(fitted.intercept_[0])
        heads.append(
            WorkerHead(
                name=worker,
                coef=coef,
                intercept=intercept,
                cost_usd=float(np.nanmean(data.cost[known, j])),
                trained_on=int(known.sum()),
            )
        )
    notify("fitting", len(data.workers), len(data.workers))
    model = RouterModel(
        dim=embedder.dim,
        embedder=embedder.name,
        cost_weight=cost_weight,
        workers=heads,
        trained={
            "suites": sorted({item.suite for item in data.items}),
            "training_items": int((~held).sum()),
            "held_out_items": int(held.sum()),
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    )
    report = routing_report(data, embeddings, Router(model, embedder))
    return model, report


def _embed(
    embedder: QuestionEmbedder, texts: list[str], notify: Progress
) -> npt.NDArray[np.float32]:
    batch = 64
    parts = []
    for start in range(0, len(texts), batch):
        notify("embedding", start, len(texts))
        parts.append(embedder.embed(texts[start : start + batch]))
    notify("embedding", len(texts), len(texts))
    return np.concatenate(parts)


def routing_report(
    data: RoutingData, embeddings: npt.NDArray[np.float32], router: Router
) -> dict[str, Any]:
    """Held-out accuracy and cost of each single worker, random, the oracle, and the curves of
    the router, ``knn`` and ``cluster``."""
    from sklearn.cluster import KMeans  # type: ignore[import-untyped]
    from sklearn.neighbors import NearestNeighbors  # type: ignore[import-untyped]

    held = data.held_out
    # Held-out items every worker ran: each router is judged on the same questions.
    complete = held & ~np.isnan(data.right).any(axis=1)
    right, cost = data.right[complete], data.cost[complete]
    n = int(complete.sum())
    if n == 0:
        raise ConfigurationError("no held-out item was run by every worker")
    train = ~held
    train_right = np.where(np.isnan(data.right[train]), 0.0, data.right[train])
    train_cost = np.nanmean(data.cost[train], axis=0)
    rows = np.arange(n)

    def sweep(name: str, p_right: npt.NDArray[np.float64]) -> Curve:
        curve = Curve(name)
        for weight in COST_WEIGHTS:
            pick = (p_right - weight * train_cost * PER_QUESTIONS).argmax(axis=1)
            curve.points.append(
                {
                    "cost_weight": weight,
                    "accuracy": float(right[rows, pick].mean()),
                    "cost_usd": float(cost[rows, pick].mean()),
                    "correct": int(right[rows, pick].sum()),
                }
            )
        return curve

    held_embeddings = embeddings[complete]
    neighbours = NearestNeighbors(n_neighbors=min(KNN_NEIGHBOURS, int(train.sum())))
    _, nearest = neighbours.fit(embeddings[train]).kneighbors(held_embeddings)
    clusters = min(CLUSTERS, int(train.sum()))
    kmeans = KMeans(n_clusters=clusters, n_init=4, random_state=0).fit(embeddings[train])
    members = [kmeans.labels_ == k for k in range(clusters)]
    per_cluster = np.array(
        [train_right[m].mean(axis=0) if m.any() else train_right.mean(axis=0) for m in members]
    )
    curves = [
        sweep("router", router.p_right(held_embeddings)),
        sweep("knn", train_right[nearest].mean(axis=1)),
        sweep("cluster", per_cluster[kmeans.predict(held_embeddings)]),
    ]
    singles = {
        worker: {
            "accuracy": float(right[:, j].mean()),
            "cost_usd": float(cost[:, j].mean()),
            "correct": int(right[:, j].sum()),
        }
        for j, worker in enumerate(data.workers)
    }
    rng = random.Random(0)
    random_pick = np.array([rng.randrange(len(data.workers)) for _ in range(n)])
    # The oracle: the cheapest worker that was right, else the cheapest.
    oracle = np.array(
        [
            min(
                range(len(data.workers)),
                key=lambda j, i=i: (-right[i, j], cost[i, j]),  # type: ignore[misc]
            )
            for i in range(n)
        ]
    )
    max_cost = max(s["cost_usd"] for s in singles.values())
    return {
        "held_out_items": n,
        "workers": data.workers,
        "cost_per": f"USD per question (cost_weight: chance given up per USD per {PER_QUESTIONS})",
        "single": singles,
        "random": _point(right, cost, random_pick),
        "oracle": _point(right, cost, oracle),
        "curves": [
            {"name": c.name, "area": round(c.area(max_cost), 4), "points": c.points} for c in curves
        ],
        "max_cost_usd": max_cost,
    }


def _point(
    right: npt.NDArray[np.float64], cost: npt.NDArray[np.float64], pick: npt.NDArray[np.int_]
) -> dict[str, float]:
    rows = np.arange(len(pick))
    return {
        "accuracy": float(right[rows, pick].mean()),
        "cost_usd": float(cost[rows, pick].mean()),
        "correct": int(right[rows, pick].sum()),
    }
