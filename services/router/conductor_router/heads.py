"""The router's head, fitted on inputs ``fitting`` makes (the domain chances, the embedding,
the standardised text features): per worker a logistic regression (scikit-learn), or an mlp
whose networks an ``MlpFitter`` trains (the trainer's, in torch: this package reads numpy
only), or, with ``auto``, the one of the two whose area under the accuracy/cost curve is larger
in cross-validation on the training items (its accuracy, where cost separates no worker). Both
are scored on the same folds, each fold's items routed as serving routes them at each swept
cost weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from conductor_router.model import (
    PER_QUESTIONS,
    DomainHead,
    MlpNetwork,
    MlpWeights,
    RouterModel,
    WorkerHead,
)
from conductor_router.report import COST_WEIGHTS, curve_area
from conductor_router.serving import best_workers, mlp_chances, sigmoid
from conductor_router.text_features import QUESTION_FEATURES

# The inverse regularisation of each worker's logistic head is chosen per training set, by
# 5-fold cross-validation over its training items, among HEAD_C_GRID: what suits one pool does
# not suit another (on RouterBench's training split the curve area was best at 0.3; on
# RouterDC's, with seven 7-8B models of one price, the mean accuracy per benchmark at 0.1).
# The score is the routed utility (right share minus cost weight times cost) averaged over the
# swept cost weights: at one price for all it is the routed accuracy. Fewer training items
# than CV_MIN_ITEMS: HEAD_C, with no cross-validation (a fifth of a few hundred items cannot
# tell these values apart, and the 20 extra fits per head would cost more than they tell).
HEAD_C = 0.3
HEAD_C_GRID = (0.03, 0.1, 0.3, 1.0)
CV_FOLDS = 5
CV_MIN_ITEMS = 500
# Which head the router gets: ``auto`` fits both on the cross-validation folds and keeps the
# one whose mean area under the accuracy/cost curve over the held-out folds is larger (where
# every worker costs the same on each question, its mean accuracy; a tie, or too few training
# items to cross-validate: ``logistic``).
HeadChoice = Literal["logistic", "mlp", "auto"]
HEAD_CHOICES: tuple[HeadChoice, ...] = ("logistic", "mlp", "auto")
CvMeasure = Literal["area", "accuracy"]


class MlpFitter(Protocol):
    """Trains the networks of an ``mlp`` head: from ``inputs`` (items, inputs) and ``right``
    (items, workers: the share of right answers, NaN where a worker's result is not
    recorded), the weights of each network whose chances serving averages."""

    settings: dict[str, Any]  # recorded in the router file

    def __call__(
        self, inputs: npt.NDArray[np.float64], right: npt.NDArray[np.float64]
    ) -> list[MlpWeights]: ...


Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass(frozen=True)
class HeadInputs:
    """What a logistic or mlp head reads, for every question, and what is known with it."""

    values: npt.NDArray[np.float64]  # (questions, domains + embedding + text features)
    expected_cost: npt.NDArray[np.float64]  # (questions, workers), as serving reckons it
    heads: list[WorkerHead]  # with their costs per domain where there is a domain head
    feature_mean: npt.NDArray[np.float64]
    feature_scale: npt.NDArray[np.float64]
    domains: DomainHead | None


def fit_head(
    inputs: HeadInputs,
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    common: dict[str, Any],
    notify: Progress,
    head: HeadChoice,
    mlp: MlpFitter | None,
) -> RouterModel:
    """The router's head as ``head`` says: with ``auto``, each candidate's mean score on the
    cross-validation folds decides (recorded in the file's ``trained``: ``head``,
    ``head_choice``, ``head_cv_measure``, ``head_cv``)."""
    folds = _cv_folds(train, right, cost)
    measure = _cv_measure(folds, cost)
    candidates = ["logistic", "mlp"] if head == "auto" else [head]
    scores: dict[str, float] = {}
    trained: dict[str, Any] = {"head_choice": head, "head_cv_folds": len(folds)}
    head_c = HEAD_C  # chosen below whenever the logistic head is a candidate
    if "logistic" in candidates:
        head_c, c_scores, held_chances = _choose_head_c(inputs, right, cost, train, folds, notify)
        trained |= {"head_c": head_c, "head_c_cv": c_scores}
        if folds:
            scores["logistic"] = _cv_score(measure, held_chances, folds, right, cost, inputs)
    if "mlp" in candidates and folds:
        assert mlp is not None  # checked by fit_routers
        held_chances = []
        for f, fold in enumerate(folds):
            notify("cross-validating the mlp head", f, len(folds))
            fit_on = train.copy()
            fit_on[fold] = False
            networks = mlp(inputs.values[fit_on], right[fit_on])
            held_chances.append(mlp_chances(networks, inputs.values[fold]))
        notify("cross-validating the mlp head", len(folds), len(folds))
        scores["mlp"] = _cv_score(measure, held_chances, folds, right, cost, inputs)
    # Chosen on the scores as recorded; ties, and ``auto`` without folds, keep the logistic head.
    scores = {c: round(a, 6) for c, a in scores.items()}
    chosen = max(candidates, key=lambda c: (scores.get(c, -math.inf), c == "logistic"))
    trained |= {"head": chosen, "head_cv": scores}
    if folds:
        trained["head_cv_measure"] = measure
    common = {**common, "trained": {**common["trained"], **trained}}
    if chosen == "mlp":
        assert mlp is not None
        return _fit_mlp(inputs, right, train, common, notify, mlp)
    return _fit_logistic(inputs, right, train, common, notify, head_c)


def _fit_logistic(
    inputs: HeadInputs,
    right: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    common: dict[str, Any],
    notify: Progress,
    head_c: float,
) -> RouterModel:
    """Per worker a logistic head over the inputs, at inverse regularisation ``head_c``."""
    fitted_heads = []
    for j, head in enumerate(inputs.heads):
        notify("fitting", j, len(inputs.heads))
        coef, intercept = _fit_worker_logistic(inputs.values, right[:, j], train, head_c)
        fitted_heads.append(head.model_copy(update={"coef": coef, "intercept": intercept}))
    notify("fitting", len(inputs.heads), len(inputs.heads))
    return RouterModel(head="logistic", workers=fitted_heads, **_input_fields(inputs), **common)


def _fit_mlp(
    inputs: HeadInputs,
    right: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    common: dict[str, Any],
    notify: Progress,
    mlp: MlpFitter,
) -> RouterModel:
    """The mlp head's networks, trained on every training item."""
    notify("fitting the mlp head", 0, 1)
    networks = mlp(inputs.values[train], right[train])
    notify("fitting the mlp head", 1, 1)
    trained = {**common["trained"], "mlp": mlp.settings}
    return RouterModel(
        head="mlp",
        networks=[MlpNetwork.of(w) for w in networks],
        workers=inputs.heads,
        **_input_fields(inputs),
        **{**common, "trained": trained},
    )


def _input_fields(inputs: HeadInputs) -> dict[str, Any]:
    """The router file's fields that say how its inputs are made."""
    return {
        "features": list(QUESTION_FEATURES),
        "feature_mean": inputs.feature_mean.tolist(),
        "feature_scale": inputs.feature_scale.tolist(),
        "domains": inputs.domains,
    }


def _fit_worker_logistic(
    inputs: npt.NDArray[np.float64],
    right: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    head_c: float,
) -> tuple[list[float], float]:
    """One worker's logistic head on the ``train`` items it ran: coefficients and intercept."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]

    known = train & ~np.isnan(right)
    shares = right[known]
    if shares.min() == shares.max():  # always right or always wrong: a constant head
        rate = min(max(shares.mean(), 0.01), 0.99)
        return [0.0] * inputs.shape[1], math.log(rate / (1 - rate))
    # Each item twice, as right with weight = its share of right answers and as wrong with the
    # rest: the head fits the share, not a coin flip.
    x = np.concatenate([inputs[known], inputs[known]])
    y = np.concatenate([np.ones(len(shares)), np.zeros(len(shares))])
    weights = np.concatenate([shares, 1 - shares])
    fitted = LogisticRegression(C=head_c, max_iter=2000).fit(x, y, sample_weight=weights)
    return fitted.coef_[0].tolist(), float(fitted.intercept_[0])


def _cv_folds(
    train: npt.NDArray[np.bool_], right: npt.NDArray[np.float64], cost: npt.NDArray[np.float64]
) -> list[npt.NDArray[np.intp]]:
    """The cross-validation folds: the training items every worker ran, at cost known, in
    CV_FOLDS seeded random parts; none with fewer than CV_MIN_ITEMS such items."""
    complete = np.flatnonzero(train & ~np.isnan(right).any(axis=1) & ~np.isnan(cost).any(axis=1))
    if len(complete) < CV_MIN_ITEMS:
        return []
    rng = np.random.default_rng(0)
    return np.array_split(rng.permutation(complete), CV_FOLDS)


def _choose_head_c(
    inputs: HeadInputs,
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    folds: list[npt.NDArray[np.intp]],
    notify: Progress,
) -> tuple[float, dict[str, float], list[npt.NDArray[np.float64]]]:
    """The HEAD_C_GRID value whose heads, fitted on the training items outside a fold, routed
    the fold best (routed utility averaged over the swept cost weights), each value's score,
    and the chosen value's chances on each fold. No folds: HEAD_C."""
    if not folds:
        return HEAD_C, {}, []
    weights = np.array(COST_WEIGHTS)[:, None, None] * PER_QUESTIONS
    scores: dict[str, float] = {}
    chances: dict[float, list[npt.NDArray[np.float64]]] = {}
    total = len(HEAD_C_GRID) * len(folds)
    for g, head_c in enumerate(HEAD_C_GRID):
        utility = []
        chances[head_c] = []
        for f, fold in enumerate(folds):
            notify("choosing the regularisation", g * len(folds) + f, total)
            fit_on = train.copy()
            fit_on[fold] = False
            p = np.empty((len(fold), right.shape[1]))
            for j in range(right.shape[1]):
                coef, intercept = _fit_worker_logistic(inputs.values, right[:, j], fit_on, head_c)
                p[:, j] = sigmoid(inputs.values[fold] @ np.array(coef) + intercept)
            chances[head_c].append(p)
            expected = inputs.expected_cost[fold][None]
            picks = (p[None] - weights * expected).argmax(axis=2)
            rows = np.arange(len(fold))
            got = right[fold][rows, picks] - weights[:, :, 0] * cost[fold][rows, picks]
            utility.append(got.mean(axis=0))
        scores[f"{head_c:g}"] = round(float(np.concatenate(utility).mean()), 6)
    notify("choosing the regularisation", total, total)
    best = max(HEAD_C_GRID, key=lambda c: (scores[f"{c:g}"], -c))
    return best, scores, chances[best]


def _cv_measure(folds: list[npt.NDArray[np.intp]], cost: npt.NDArray[np.float64]) -> CvMeasure:
    """``area`` (under the accuracy/cost curve), unless every worker costs the same on each
    folded question (RouterDC's table: no cost recorded, one price for all): then the curve is
    a single point, whose area is 0 for every head, and the heads are compared on ``accuracy``
    (routed at cost weight 0)."""
    if not folds:
        return "area"
    folded = cost[np.concatenate(folds)]
    return "accuracy" if bool((folded == folded[:, :1]).all()) else "area"


def _cv_score(
    measure: CvMeasure,
    chances: list[npt.NDArray[np.float64]],
    folds: list[npt.NDArray[np.intp]],
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    inputs: HeadInputs,
) -> float:
    """The mean over the folds of a head's ``measure`` on each: the area under the
    accuracy/cost curve that its ``chances`` trace, picking as serving picks at each swept cost
    weight, up to the cost of the fold's dearest worker (as the held-out report reckons it); or
    its accuracy at cost weight 0."""
    scores = []
    for p, fold in zip(chances, folds, strict=True):
        rows = np.arange(len(fold))
        expected_cost = inputs.expected_cost[fold]
        if measure == "accuracy":
            scores.append(right[fold][rows, best_workers(p, expected_cost, 0.0)].mean())
            continue
        points = []
        for weight in COST_WEIGHTS:
            pick = best_workers(p, expected_cost, weight)
            points.append((cost[fold][rows, pick].mean(), right[fold][rows, pick].mean()))
        scores.append(curve_area(points, float(cost[fold].mean(axis=0).max())))
    return float(np.mean(scores))
