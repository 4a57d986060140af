"""Fitting conductor-mini's router and its two baselines from arrays: the questions, their
embeddings, per question and worker the share of right answers (NaN: not run) and the cost,
and which questions are for training.

- the router: per worker a logistic head over the embedding and the standardised text
  features, fitted by scikit-learn on the share of right answers; where the training questions
  come from several domains (benchmarks, an outcome table's domains), a domain head first
  (which domain a question is from, learnt from those labels), whose chances the worker heads
  read too, and each worker's mean cost per domain;
- ``knn``: the training questions' embeddings and right-shares (the best worker of the 15
  nearest training questions);
- ``cluster``: k-means on the training embeddings, each cluster's right-shares (the best
  worker of each cluster, as Avengers-Pro does).

Each is a router file of its own (``model``), served by the same ``Router``. Every head keeps
its worker's mean cost over the training questions it ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from conductor.errors import ConfigurationError
from conductor_router.embedding import QuestionEmbedder
from conductor_router.model import PER_QUESTIONS, DomainHead, RouterModel, WorkerHead
from conductor_router.packed_array import PackedArray
from conductor_router.report import COST_WEIGHTS
from conductor_router.serving import domain_costs, known_mean, softmax
from conductor_router.text_features import QUESTION_FEATURES, question_features

# The inverse regularisation of each worker's logistic head is chosen per training set, by
# 5-fold cross-validation over its training items, among HEAD_C_GRID: what suits one pool does
# not suit another (on RouterBench's training split the curve area was best at 0.3; on
# RouterDC's, with seven 7-8B models of one price, the mean accuracy per benchmark at 0.1).
# The score is the routed utility (right share minus cost weight times cost) averaged over the
# swept cost weights: at one price for all it is the routed accuracy. Fewer training items
# than CV_MIN_ITEMS: HEAD_C, with no cross-validation (a fifth of a few hundred items cannot
# tell these values apart, and the 20 extra fits per head would cost more than they tell).
# The domain chances enter the heads at weight 10: chosen on RouterBench's training split,
# where without them (C = 3, the choice made on the simulated pool) the curve area was 0.8223
# and with them (C = 0.3) 0.8267.
HEAD_C = 0.3
HEAD_C_GRID = (0.03, 0.1, 0.3, 1.0)
CV_FOLDS = 5
CV_MIN_ITEMS = 500
DOMAIN_WEIGHT = 10.0
DOMAIN_C = 1.0
KNN_NEIGHBOURS = 15
CLUSTERS = 20
EMBED_BATCH = 64

Progress = Callable[[str, int, int], None]  # (stage, done, total)


def _quiet(stage: str, done: int, total: int) -> None:
    """No progress shown."""


def embed_questions(
    embedder: QuestionEmbedder, texts: Sequence[str], progress: Progress | None = None
) -> npt.NDArray[np.float32]:
    """(texts, dim): the embeddings of ``texts``, in batches, reporting stage ``embedding``."""
    notify = progress or _quiet
    parts = []
    for start in range(0, len(texts), EMBED_BATCH):
        notify("embedding", start, len(texts))
        parts.append(embedder.embed(texts[start : start + EMBED_BATCH]))
    notify("embedding", len(texts), len(texts))
    return np.concatenate(parts)


def fit_routers(
    questions: Sequence[str],
    embeddings: npt.NDArray[np.float32],
    *,
    workers: Sequence[str],
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    embedder: QuestionEmbedder,
    cost_weight: float = 0.0,
    domains: Sequence[str] | None = None,
    trained: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> dict[str, RouterModel]:
    """The router (``router``: one logistic head per worker) and the ``knn`` and ``cluster``
    baselines, fitted on the questions ``train`` marks. ``right`` and ``cost`` are (questions,
    workers), NaN where a worker did not run; ``domains`` is each question's domain (its
    benchmark), when known; ``embedder`` names the embeddings' model and dimensions;
    ``trained`` is the provenance the files keep."""
    notify = progress or _quiet
    known = train[:, None] & ~np.isnan(right)
    for j, worker in enumerate(workers):
        if not known[:, j].any():
            raise ConfigurationError(f"worker {worker} has no training results")
    common: dict[str, Any] = {
        "dim": embedder.dim,
        "embedder": embedder.name,
        "cost_weight": cost_weight,
        "trained": trained or {},
    }
    heads = [
        WorkerHead(
            name=worker,
            cost_usd=float(np.nanmean(cost[known[:, j], j])),
            trained_on=int(known[:, j].sum()),
        )
        for j, worker in enumerate(workers)
    ]
    labels = None if domains is None else np.array(domains, dtype=object)
    return {
        "router": _fit_logistic(
            questions, embeddings, right, cost, train, labels, heads, common, notify
        ),
        "knn": _fit_knn(embeddings, right, train, heads, common),
        "cluster": _fit_cluster(embeddings, right, train, heads, common),
    }


def _fit_logistic(
    questions: Sequence[str],
    embeddings: npt.NDArray[np.float32],
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    domains: npt.NDArray[Any] | None,
    heads: list[WorkerHead],
    common: dict[str, Any],
    notify: Progress,
) -> RouterModel:
    """Per worker a logistic head over the domain chances (when the training questions come
    from several domains), the embedding and the standardised text features."""
    raw = question_features(questions)
    feature_mean = raw[train].mean(axis=0)
    feature_scale = raw[train].std(axis=0)
    feature_scale[feature_scale == 0] = 1.0
    inputs = np.hstack([embeddings, (raw - feature_mean) / feature_scale])
    domain_head = None
    if domains is not None and len(set(domains[train])) > 1:
        domain_head, chances = _fit_domains(inputs, domains, train)
        heads = [
            head.model_copy(
                update={
                    "domain_cost_usd": _domain_costs(
                        cost[:, j], right[:, j], domains, train, domain_head.names, head.cost_usd
                    )
                }
            )
            for j, head in enumerate(heads)
        ]
        inputs = np.hstack([chances * DOMAIN_WEIGHT, inputs])
    expected_cost = _expected_costs(heads, inputs, domain_head)
    head_c, scores = _choose_head_c(inputs, right, cost, expected_cost, train, notify)
    fitted_heads = []
    for j, head in enumerate(heads):
        notify("fitting", j, len(heads))
        coef, intercept = _fit_head(inputs, right[:, j], train, head_c)
        fitted_heads.append(head.model_copy(update={"coef": coef, "intercept": intercept}))
    notify("fitting", len(heads), len(heads))
    common = {**common, "trained": {**common["trained"], "head_c": head_c, "head_c_cv": scores}}
    return RouterModel(
        head="logistic",
        features=list(QUESTION_FEATURES),
        feature_mean=feature_mean.tolist(),
        feature_scale=feature_scale.tolist(),
        domains=domain_head,
        workers=fitted_heads,
        **common,
    )


def _fit_head(
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


def _expected_costs(
    heads: list[WorkerHead], inputs: npt.NDArray[np.float64], domains: DomainHead | None
) -> npt.NDArray[np.float64]:
    """(questions, workers): each worker's expected cost per question, as serving reckons it."""
    if domains is None:
        return np.tile([h.cost_usd for h in heads], (len(inputs), 1))
    chances = inputs[:, : len(domains.names)] / domains.weight
    result: npt.NDArray[np.float64] = chances @ domain_costs(heads, len(domains.names))
    return result


def _choose_head_c(
    inputs: npt.NDArray[np.float64],
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    expected_cost: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    notify: Progress,
) -> tuple[float, dict[str, float]]:
    """The HEAD_C_GRID value whose heads, fitted on four fifths of the training items, routed
    the other fifth best (routed utility averaged over the swept cost weights), and each
    value's score. Only items every worker ran are scored; too few training items: HEAD_C."""
    complete = np.flatnonzero(train & ~np.isnan(right).any(axis=1) & ~np.isnan(cost).any(axis=1))
    if len(complete) < CV_MIN_ITEMS:
        return HEAD_C, {}
    rng = np.random.default_rng(0)
    folds = np.array_split(rng.permutation(complete), CV_FOLDS)
    weights = np.array(COST_WEIGHTS)[:, None, None] * PER_QUESTIONS
    scores: dict[str, float] = {}
    total = len(HEAD_C_GRID) * CV_FOLDS
    for g, head_c in enumerate(HEAD_C_GRID):
        utility = []
        for f, fold in enumerate(folds):
            notify("choosing the regularisation", g * CV_FOLDS + f, total)
            fit_on = train.copy()
            fit_on[fold] = False
            p = np.empty((len(fold), right.shape[1]))
            for j in range(right.shape[1]):
                coef, intercept = _fit_head(inputs, right[:, j], fit_on, head_c)
                p[:, j] = 1 / (1 + np.exp(-(inputs[fold] @ np.array(coef) + intercept)))
            picks = (p[None] - weights * expected_cost[fold][None]).argmax(axis=2)
            rows = np.arange(len(fold))
            got = right[fold][rows, picks] - weights[:, :, 0] * cost[fold][rows, picks]
            utility.append(got.mean(axis=0))
        scores[f"{head_c:g}"] = round(float(np.concatenate(utility).mean()), 6)
    notify("choosing the regularisation", total, total)
    best = max(HEAD_C_GRID, key=lambda c: (scores[f"{c:g}"], -c))
    return best, scores


def _fit_domains(
    inputs: npt.NDArray[np.float64], domains: npt.NDArray[Any], train: npt.NDArray[np.bool_]
) -> tuple[DomainHead, npt.NDArray[np.float64]]:
    """The domain head, learnt from the training questions' domains, and every question's
    domain chances as serving computes them."""
    from sklearn.linear_model import LogisticRegression

    names = sorted(set(domains[train]))
    labels = np.array([names.index(d) for d in domains[train]])
    fitted = LogisticRegression(C=DOMAIN_C, max_iter=2000).fit(inputs[train], labels)
    coef, intercept = fitted.coef_, fitted.intercept_
    if len(names) == 2:  # scikit-learn keeps one row for two classes: the second's logit
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.r_[0.0, intercept]
    head = DomainHead(
        names=names,
        coef=coef.tolist(),
        intercept=intercept.tolist(),
        weight=DOMAIN_WEIGHT,
    )
    return head, softmax(inputs @ coef.T + intercept)


def _domain_costs(
    cost: npt.NDArray[np.float64],
    right: npt.NDArray[np.float64],
    domains: npt.NDArray[Any],
    train: npt.NDArray[np.bool_],
    names: list[str],
    mean: float,
) -> list[float]:
    """A worker's mean cost per domain over the training questions it ran (none: its mean)."""
    ran = train & ~np.isnan(right) & ~np.isnan(cost)
    out = []
    for name in names:
        here = ran & (domains == name)
        out.append(float(cost[here].mean()) if here.any() else mean)
    return out


def _fit_knn(
    embeddings: npt.NDArray[np.float32],
    right: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    heads: list[WorkerHead],
    common: dict[str, Any],
) -> RouterModel:
    """The training questions' embeddings and their right-shares, unknown kept as NaN. The
    embeddings are kept in float16, half the file of float32: finding for 600 of the simulated
    run's questions the 15 nearest of the other 2,891, it changed 2 of the 9,000 found."""
    return RouterModel(
        head="knn",
        points=PackedArray.of(embeddings[train], "float16"),
        right=PackedArray.of(right[train], "float32"),
        neighbours=min(KNN_NEIGHBOURS, int(train.sum())),
        workers=heads,
        **common,
    )


def _fit_cluster(
    embeddings: npt.NDArray[np.float32],
    right: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    heads: list[WorkerHead],
    common: dict[str, Any],
) -> RouterModel:
    """k-means centroids of the training questions and per cluster the known mean of its
    questions' right-shares (none known for a worker: the worker's training mean)."""
    from sklearn.cluster import KMeans  # type: ignore[import-untyped]

    train_known = ~np.isnan(right[train])
    train_right = np.where(train_known, right[train], 0.0)
    prior = known_mean(train_right, train_known, np.zeros(len(heads)))
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
