"""Training conductor-mini's router from ``conductor eval`` results and traces, and the report
that says whether it learned anything.

The data: every item an evaluation ran with ``single:NAME`` strategies gives, per worker, right
or wrong and what it cost; a traced one-step workflow with feedback or a reference label gives
it for the one worker that ran (``trace_routing``), the others unknown. The router learns on
the items outside the held-out split (the same split by item key as ``conductor train`` and
``conductor eval --held-out``) and is judged on the held-out ones, against what a router has to
beat: each worker alone, a random pick, the oracle (per item the cheapest worker that was
right: an upper bound), and two baselines fitted on the same embeddings and items: ``knn`` (the
best worker of the 15 nearest training questions) and ``cluster`` (k-means on the embeddings,
the best worker of each cluster, as Avengers-Pro does). The baselines are router files of their
own (conductor_router serves all three), and the report scores each through the same
``Router`` that serving and ``conductor eval --strategies router:FILE`` use. Every router is
swept over cost weights, giving its accuracy/cost curve; the area under it (accuracy integrated
over cost up to the dearest worker's, divided by that cost) compares routers over the whole
curve. Routers are compared on the held-out items every worker ran; when none did (traces
alone: one worker per question), the routers are fitted and the report says that they could
not be judged.
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
from conductor_evaluation import EvalItem, ItemResult, ResultStore, is_held_out, load_suite
from conductor_router import (
    PER_QUESTIONS,
    QUESTION_FEATURES,
    PackedArray,
    QuestionEmbedder,
    Router,
    RouterModel,
    WorkerHead,
    known_mean,
    question_features,
)

SINGLE = "single:"
# Inverse regularisation of each logistic head, chosen by the curve area in 5-fold
# cross-validation on the simulated run's training items (3 repeats): 0.7745 at C = 1, 0.7759
# at 3, 0.7753 at 10. Chosen per head by cross-validated log-loss instead, it routed worse:
# log-loss is not what routing needs.
HEAD_C = 3.0
KNN_NEIGHBOURS = 15
BOOTSTRAP = 300  # resamples of the held-out items for the confidence intervals
CLUSTERS = 20
# Cost weights swept for the curves: 0 (accuracy only), then up to where the cheapest worker wins.
COST_WEIGHTS = (0.0, *np.geomspace(0.001, 2.0, 24).round(5).tolist())

Progress = Callable[[str, int, int], None]  # (stage, done, total)
NOT_JUDGED = (
    "no held-out item was run by every worker, so no router could be judged against the others "
    "(a traced workflow says how one worker did): the router is fitted all the same. To judge "
    "it, evaluate the pool with `conductor eval --strategies 'single:*'` and train on that too."
)


@dataclass
class RoutingData:
    """Items with, per worker, the share of right answers over the evaluations that ran it
    (1.0 or 0.0 from one evaluation; nan: not run), and the mean cost."""

    items: list[EvalItem]
    workers: list[str]
    right: npt.NDArray[np.float64]  # (items, workers)
    cost: npt.NDArray[np.float64]  # (items, workers), USD per question

    @property
    def held_out(self) -> npt.NDArray[np.bool_]:
        return np.array([is_held_out(item) for item in self.items])


def routing_data(eval_dirs: Sequence[Path]) -> RoutingData:
    """The ``single:*`` results of one or more evaluation directories, with their items. The
    same item evaluated several times (the simulator with other seeds, a provider's answers on
    other days) counts as the share of its right answers: a softer, truer label than one roll."""
    results: list[ItemResult] = []
    for eval_dir in eval_dirs:
        found = [r for r in ResultStore(eval_dir).load() if r.strategy.startswith(SINGLE)]
        if not found:
            raise ConfigurationError(
                f"{eval_dir}: no single-worker results to learn from; run `conductor eval "
                f"--strategies 'single:*' --out {eval_dir}` first"
            )
        results += [r for r in found if r.status != "error"]
    workers = sorted({r.strategy.removeprefix(SINGLE) for r in results})
    column = {worker: j for j, worker in enumerate(workers)}
    by_item: dict[tuple[str, str], list[ItemResult]] = {}
    for r in results:
        by_item.setdefault((r.suite, r.item_id), []).append(r)
    items = _items(eval_dirs, sorted({suite for suite, _ in by_item}), set(by_item))
    right = np.zeros((len(items), len(workers)))
    cost = np.zeros((len(items), len(workers)))
    runs = np.zeros((len(items), len(workers)))
    for i, item in enumerate(items):
        for r in by_item[(item.suite, item.id)]:
            j = column[r.strategy.removeprefix(SINGLE)]
            right[i, j] += r.correct
            cost[i, j] += r.cost_usd
            runs[i, j] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return RoutingData(items, workers, right / runs, cost / runs)


def combine_routing_data(parts: Sequence[RoutingData]) -> RoutingData:
    """One set of items over every worker of the parts (nan where a part's worker did not run);
    the parts' items must be distinct (evaluated items and traced workflows are)."""
    workers = sorted({worker for part in parts for worker in part.workers})
    column = {worker: j for j, worker in enumerate(workers)}
    items = [item for part in parts for item in part.items]
    right = np.full((len(items), len(workers)), np.nan)
    cost = np.full((len(items), len(workers)), np.nan)
    start = 0
    for part in parts:
        rows = slice(start, start + len(part.items))
        columns = [column[worker] for worker in part.workers]
        right[rows, columns], cost[rows, columns] = part.right, part.cost
        start = rows.stop
    return RoutingData(items, workers, right, cost)


def _items(
    eval_dirs: Sequence[Path], suites: list[str], keys: set[tuple[str, str]]
) -> list[EvalItem]:
    items: list[EvalItem] = []
    for suite in suites:
        try:
            loaded = load_suite(suite)
        except ConfigurationError as exc:
            message = f"the evaluated suite {suite} cannot be loaded: {exc}"
            raise ConfigurationError(message) from exc
        items += [item for item in loaded if (item.suite, item.id) in keys]
    if not items:
        names = ", ".join(str(d) for d in eval_dirs)
        raise ConfigurationError(f"{names}: none of the items evaluated are in their suites")
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
) -> tuple[dict[str, RouterModel], dict[str, Any]]:
    """The router (one logistic head per worker) and the ``knn`` and ``cluster`` baselines, all
    fitted on the training items and keyed by their names in the report, and the report on the
    held-out items."""
    notify = progress or (lambda stage, done, total: None)
    questions = [item.question for item in data.items]
    embeddings = _embed(embedder, questions, notify)
    held = data.held_out
    if held.all() or not held.any():
        raise ConfigurationError(
            "the items fall all on one side of the held-out split: evaluate more items "
            "(--limit) or give more traces, so that both training and held-out items exist"
        )
    known = ~held[:, None] & ~np.isnan(data.right)
    for j, worker in enumerate(data.workers):
        if not known[:, j].any():
            raise ConfigurationError(f"worker {worker} has no training results")
    common: dict[str, Any] = {
        "dim": embedder.dim,
        "embedder": embedder.name,
        "cost_weight": cost_weight,
        "trained": {
            "suites": sorted({item.suite for item in data.items}),
            "training_items": int((~held).sum()),
            "held_out_items": int(held.sum()),
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    }
    # Every head of every router keeps its worker's mean cost over the training items it ran.
    heads = [
        WorkerHead(
            name=worker,
            cost_usd=float(np.nanmean(data.cost[known[:, j], j])),
            trained_on=int(known[:, j].sum()),
        )
        for j, worker in enumerate(data.workers)
    ]
    models = {
        "router": _fit_logistic(data, questions, embeddings, heads, common, notify),
        "knn": _fit_knn(data, embeddings, heads, common),
        "cluster": _fit_cluster(data, embeddings, heads, common),
    }
    routers = {name: Router(model, embedder) for name, model in models.items()}
    return models, routing_report(data, embeddings, routers)


def _fit_logistic(
    data: RoutingData,
    questions: list[str],
    embeddings: npt.NDArray[np.float32],
    heads: list[WorkerHead],
    common: dict[str, Any],
    notify: Progress,
) -> RouterModel:
    """Per worker a logistic head over the embedding and the standardised text features."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]

    train = ~data.held_out
    raw = question_features(questions)
    feature_mean = raw[train].mean(axis=0)
    feature_scale = raw[train].std(axis=0)
    feature_scale[feature_scale == 0] = 1.0
    inputs = np.hstack([embeddings, (raw - feature_mean) / feature_scale])
    fitted_heads = []
    for j, head in enumerate(heads):
        notify("fitting", j, len(heads))
        known = train & ~np.isnan(data.right[:, j])
        shares = data.right[known, j]
        if shares.min() == shares.max():  # always right or always wrong: a constant head
            rate = min(max(shares.mean(), 0.01), 0.99)
            coef, intercept = [0.0] * inputs.shape[1], math.log(rate / (1 - rate))
        else:
            # Each item twice, as right with weight = its share of right answers and as wrong
            # with the rest: the head fits the share, not a coin flip.
            x = np.concatenate([inputs[known], inputs[known]])
            y = np.concatenate([np.ones(len(shares)), np.zeros(len(shares))])
            weights = np.concatenate([shares, 1 - shares])
            fitted = LogisticRegression(C=HEAD_C, max_iter=2000).fit(x, y, sample_weight=weights)
            coef, intercept = fitted.coef_[0].tolist(), float(fitted.intercept_[0])
        fitted_heads.append(head.model_copy(update={"coef": coef, "intercept": intercept}))
    notify("fitting", len(heads), len(heads))
    return RouterModel(
        head="logistic",
        features=list(QUESTION_FEATURES),
        feature_mean=feature_mean.tolist(),
        feature_scale=feature_scale.tolist(),
        workers=fitted_heads,
        **common,
    )


def _fit_knn(
    data: RoutingData,
    embeddings: npt.NDArray[np.float32],
    heads: list[WorkerHead],
    common: dict[str, Any],
) -> RouterModel:
    """The training questions' embeddings and their right-shares, unknown kept as NaN. The
    embeddings are kept in float16, half the file of float32: finding for 600 of the simulated
    run's questions the 15 nearest of the other 2,891, it changed 2 of the 9,000 found."""
    train = ~data.held_out
    return RouterModel(
        head="knn",
        points=PackedArray.of(embeddings[train], "float16"),
        right=PackedArray.of(data.right[train], "float32"),
        neighbours=min(KNN_NEIGHBOURS, int(train.sum())),
        workers=heads,
        **common,
    )


def _fit_cluster(
    data: RoutingData,
    embeddings: npt.NDArray[np.float32],
    heads: list[WorkerHead],
    common: dict[str, Any],
) -> RouterModel:
    """k-means centroids of the training questions and per cluster the known mean of its
    questions' right-shares (none known for a worker: the worker's training mean)."""
    from sklearn.cluster import KMeans  # type: ignore[import-untyped]

    train = ~data.held_out
    train_known = ~np.isnan(data.right[train])
    train_right = np.where(train_known, data.right[train], 0.0)
    prior = known_mean(train_right, train_known, np.zeros(len(data.workers)))
    clusters = min(CLUSTERS, int(train.sum()))
    kmeans = KMeans(n_clusters=clusters, n_init=4, random_state=0).fit(embeddings[train])
    members = [kmeans.labels_ == k for k in range(clusters)]
    shares = [known_mean(train_right[m], train_known[m], prior) for m in members]
    return RouterModel(
        head="cluster",
        points=PackedArray.of(kmeans.cluster_centers_, "float32"),
        right=PackedArray.of(np.array(shares), "float32"),
        workers=heads,
        **common,
    )


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
    data: RoutingData, embeddings: npt.NDArray[np.float32], routers: dict[str, Router]
) -> dict[str, Any]:
    """Held-out accuracy and cost of each single worker, random, the oracle, and the curve of
    each router (``router``, ``knn``, ``cluster``: the first is the one the others are compared
    with), each choosing as ``Router.choose`` does with every worker allowed."""
    held = data.held_out
    # Held-out items every worker ran: each router is judged on the same questions.
    complete = held & ~np.isnan(data.right).any(axis=1)
    right, cost = data.right[complete], data.cost[complete]
    n = int(complete.sum())
    partial = int(held.sum()) - n  # held-out items some worker did not run: not judged
    if n == 0:
        return {
            "held_out_items": 0,
            "held_out_partial_items": partial,
            "workers": data.workers,
            "note": NOT_JUDGED,
        }
    held_embeddings = embeddings[complete]
    held_questions = [
        item.question for item, kept in zip(data.items, complete, strict=True) if kept
    ]
    picks: dict[str, npt.NDArray[np.int_]] = {}  # per router: (cost weights, items)
    curves = []
    for name, router in routers.items():
        column = np.array([data.workers.index(worker) for worker in router.names])
        p_right = router.p_right(held_embeddings, held_questions)
        curve = Curve(name)
        chosen = []
        for weight in COST_WEIGHTS:
            pick = column[router.picks(p_right, weight)]
            chosen.append(pick)
            curve.points.append({"cost_weight": weight, **_point(right, cost, pick)})
        picks[name] = np.array(chosen)
        curves.append(curve)
    first = curves[0].name
    singles: dict[str, dict[str, Any]] = {
        worker: _point(right, cost, np.full(n, j)) for j, worker in enumerate(data.workers)
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
    areas = _bootstrap_areas(right, cost, picks, max_cost)
    for j, worker in enumerate(data.workers):
        singles[worker]["accuracy_ci"] = _bootstrap_accuracy(right[:, j])
    return {
        "held_out_items": n,
        "held_out_partial_items": partial,
        "workers": data.workers,
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
                "points": c.points,
            }
            for c in curves
        ],
        "bootstrap": f"{BOOTSTRAP} resamples of the held-out items, 95% intervals",
        "max_cost_usd": max_cost,
    }


def _interval(values: npt.NDArray[np.float64]) -> list[float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def _bootstrap_accuracy(right: npt.NDArray[np.float64]) -> list[float]:
    rng = np.random.default_rng(0)
    samples = rng.integers(0, len(right), size=(BOOTSTRAP, len(right)))
    return _interval(right[samples].mean(axis=1))


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
