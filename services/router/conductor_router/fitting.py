"""Fitting conductor-mini's router and its two baselines from arrays: the questions, their
embeddings, per question and worker the share of right answers (NaN: not run) and the cost,
and which questions are for training.

- the router: where the training questions come from several domains (benchmarks, an
  outcome table's domains), a domain head first (which domain a question is from, learnt from
  those labels) and each worker's mean cost per domain; then a head (``heads``: a logistic
  regression per worker, or an mlp, or whichever cross-validates better) over the domain
  chances, the embedding and the standardised text features, fitted on the share of right
  answers;
- ``knn``: the training questions' embeddings and right-shares (the best worker of the 15
  nearest training questions);
- ``cluster``: k-means on the training embeddings, each cluster's right-shares (the best
  worker of each cluster, as Avengers-Pro does).

Each is a router file of its own (``model``), served by the same ``Router``. Every head keeps
its worker's mean cost over the training questions it ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from conductor.errors import ConfigurationError
from conductor_router.embedding import QuestionEmbedder
from conductor_router.heads import (
    HEAD_CHOICES,
    HeadChoice,
    HeadInputs,
    MlpFitter,
    Progress,
    fit_head,
)
from conductor_router.model import DomainHead, RouterModel, WorkerHead
from conductor_router.packed_array import PackedArray
from conductor_router.serving import domain_costs, known_mean, softmax
from conductor_router.text_features import question_features

# The domain chances enter the heads at weight 10: chosen on RouterBench's training split,
# where without them (C = 3, the choice made on the simulated pool) the curve area was 0.8223
# and with them (C = 0.3) 0.8267.
DOMAIN_WEIGHT = 10.0
DOMAIN_C = 1.0
KNN_NEIGHBOURS = 15
CLUSTERS = 20
EMBED_BATCH = 64


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
    head: HeadChoice = "logistic",
    mlp: MlpFitter | None = None,
) -> dict[str, RouterModel]:
    """The router (``router``: a logistic or an mlp head, as ``head`` says) and the ``knn``
    and ``cluster`` baselines, fitted on the questions ``train`` marks. ``right`` and ``cost``
    are (questions, workers), NaN where a worker did not run; ``domains`` is each question's
    domain (its benchmark), when known; ``embedder`` names the embeddings' model and
    dimensions; ``trained`` is the provenance the files keep; ``mlp`` trains the mlp head's
    networks (needed unless ``head`` is ``logistic``)."""
    notify = progress or _quiet
    if head not in HEAD_CHOICES:
        raise ConfigurationError(f"unknown head {head!r}; known: {', '.join(HEAD_CHOICES)}")
    if head != "logistic" and mlp is None:
        raise ValueError(f"head {head!r} needs an mlp fitter")
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
    inputs = _router_inputs(questions, embeddings, right, cost, train, labels, heads)
    return {
        "router": fit_head(inputs, right, cost, train, common, notify, head, mlp),
        "knn": _fit_knn(embeddings, right, train, heads, common),
        "cluster": _fit_cluster(embeddings, right, train, heads, common),
    }


def _router_inputs(
    questions: Sequence[str],
    embeddings: npt.NDArray[np.float32],
    right: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    train: npt.NDArray[np.bool_],
    domains: npt.NDArray[Any] | None,
    heads: list[WorkerHead],
) -> HeadInputs:
    """What the logistic and mlp heads read: the domain chances (times DOMAIN_WEIGHT, when the
    training questions come from several domains: the domain head is fitted here, on all of
    them), the embedding and the standardised text features."""
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
    return HeadInputs(
        values=inputs,
        expected_cost=_expected_costs(heads, inputs, domain_head),
        heads=heads,
        feature_mean=feature_mean,
        feature_scale=feature_scale,
        domains=domain_head,
    )


def _expected_costs(
    heads: list[WorkerHead], inputs: npt.NDArray[np.float64], domains: DomainHead | None
) -> npt.NDArray[np.float64]:
    """(questions, workers): each worker's expected cost per question, as serving reckons it."""
    if domains is None:
        return np.tile([h.cost_usd for h in heads], (len(inputs), 1))
    chances = inputs[:, : len(domains.names)] / domains.weight
    result: npt.NDArray[np.float64] = chances @ domain_costs(heads, len(domains.names))
    return result


def _fit_domains(
    inputs: npt.NDArray[np.float64], domains: npt.NDArray[Any], train: npt.NDArray[np.bool_]
) -> tuple[DomainHead, npt.NDArray[np.float64]]:
    """The domain head, learnt from the training questions' domains, and every question's
    domain chances as serving computes them."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]

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
