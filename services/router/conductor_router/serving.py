"""Serving a router file: a question's embedding -> per worker, the chance of a right answer
and the expected cost -> the worker that maximises chance minus ``cost_weight`` times cost,
among the workers a request may use.

The chance comes from the file's head (``model``): a logistic regression per worker reading
the embedding and the question's text features (and a domain head's chances); ``mlp``, the
mean of small networks' sigmoid outputs over the same inputs, computed here with numpy alone
(no torch where a router is served); ``knn``, per worker the mean share of right answers of
the ``neighbours`` training questions nearest in the embedding, over those whose result for the
worker is known (none known: the worker's mean over all training questions); ``cluster``, per
worker the share of right answers of the nearest centroid's questions.

Each worker is scored on its own, so any subset of the pool is scored exactly as the full pool
is: a worker left out changes nothing about the others' scores.

Cost is in USD per 1,000 questions, so ``cost_weight`` reads as: how much chance of a right
answer one would give up to save a dollar per thousand questions (0: accuracy only).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from conductor.errors import ConfigurationError
from conductor_router.embedding import QuestionEmbedder
from conductor_router.model import (
    PER_QUESTIONS,
    MlpWeights,
    RouterModel,
    WorkerHead,
    load_router_model,
)
from conductor_router.text_features import QUESTION_FEATURES, question_features


@dataclass(frozen=True)
class WorkerScore:
    p_right: float
    cost_usd: float
    utility: float


@dataclass(frozen=True)
class RoutingDecision:
    worker: str
    cost_weight: float
    scores: dict[str, WorkerScore]  # every allowed worker the router knows

    def as_record(self) -> dict[str, Any]:
        """The decision as a trace records it."""
        return {
            "router": "learned",
            "worker": self.worker,
            "cost_weight": self.cost_weight,
            "scores": {
                name: {
                    "p_right": round(s.p_right, 4),
                    "cost_usd": s.cost_usd,
                    "utility": round(s.utility, 4),
                }
                for name, s in self.scores.items()
            },
        }


class Router:
    def __init__(self, model: RouterModel, embedder: QuestionEmbedder | None = None) -> None:
        self.model = model
        self._embedder = embedder or QuestionEmbedder()
        if self._embedder.name != model.embedder or self._embedder.dim != model.dim:
            raise ConfigurationError(
                f"the router was trained on {model.embedder} ({model.dim} dimensions); this "
                f"embedder is {self._embedder.name} ({self._embedder.dim})"
            )
        self.names = [w.name for w in model.workers]
        self._cost = np.array([w.cost_usd for w in model.workers], dtype=np.float64)
        self._domains = model.domains
        if model.domains is not None:
            self._domain_coef = np.array(model.domains.coef, dtype=np.float64)
            self._domain_intercept = np.array(model.domains.intercept, dtype=np.float64)
            # (domains, workers): a worker without costs per domain costs its mean in each.
            self._domain_cost = domain_costs(model.workers, len(model.domains.names))
        if model.head in ("logistic", "mlp"):
            self._feature_columns = [QUESTION_FEATURES.index(name) for name in model.features]
            self._feature_mean = np.array(model.feature_mean, dtype=np.float64)
            self._feature_scale = np.array(model.feature_scale, dtype=np.float64)
        if model.head == "logistic":
            self._coef = np.array([w.coef for w in model.workers], dtype=np.float64)
            self._intercept = np.array([w.intercept for w in model.workers], dtype=np.float64)
        elif model.head == "mlp":
            assert model.networks is not None  # validated
            self._networks = [network.weights() for network in model.networks]
        else:
            assert model.points is not None  # validated
            assert model.right is not None
            self._points = model.points.array()
            self._point_norms = (self._points**2).sum(axis=1)
            right = model.right.array().astype(np.float64)
            self._known = ~np.isnan(right)
            self._right = np.where(self._known, right, 0.0)
            self._prior = known_mean(self._right, self._known, np.zeros(len(self.names)))
            self._neighbours = model.neighbours or 1

    @classmethod
    def load(cls, path: Path, embedder: QuestionEmbedder | None = None) -> Router:
        return cls(load_router_model(path), embedder)

    def p_right(
        self, embeddings: npt.NDArray[np.float32], questions: Sequence[str]
    ) -> npt.NDArray[np.float64]:
        """(questions, workers): each head's chance of a right answer; ``embeddings`` are the
        questions' own."""
        return self.estimate(embeddings, questions)[0]

    def estimate(
        self, embeddings: npt.NDArray[np.float32], questions: Sequence[str]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per question and worker (questions, workers): the chance of a right answer and the
        expected cost in USD (the worker's mean cost, or with a domain head its mean cost in
        each domain weighted by the question's domain chances)."""
        if self.model.head not in ("logistic", "mlp"):
            p = self._from_nearest_points(embeddings)
            return p, np.broadcast_to(self._cost, p.shape)
        inputs, cost = self._inputs(embeddings, questions)
        if self.model.head == "mlp":
            return mlp_chances(self._networks, inputs), cost
        return sigmoid(inputs @ self._coef.T + self._intercept), cost

    def _inputs(
        self, embeddings: npt.NDArray[np.float32], questions: Sequence[str]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Logistic and mlp heads: what they read per question (the domain chances times the
        domain head's weight, the embedding, the standardised text features) and the expected
        costs (questions, workers)."""
        inputs = embeddings.astype(np.float64)
        if self._feature_columns:
            raw = question_features(questions)[:, self._feature_columns]
            inputs = np.hstack([inputs, (raw - self._feature_mean) / self._feature_scale])
        if self._domains is None:
            cost = np.broadcast_to(self._cost, (len(inputs), len(self.names)))
        else:
            chances = softmax(inputs @ self._domain_coef.T + self._domain_intercept)
            cost = chances @ self._domain_cost
            inputs = np.hstack([chances * self._domains.weight, inputs])
        return inputs, cost

    def _from_nearest_points(self, embeddings: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        """knn: the known mean of the nearest points' shares; cluster: the nearest centroid's.
        One question at a time, as serving asks, so that a batch (the training report) finds
        the same nearest points bit for bit: a matrix product may round otherwise."""
        k = self._neighbours
        rows = []
        for question in embeddings.astype(np.float32):
            # Squared Euclidean distance less |question|^2, the same for every point.
            distance = self._point_norms - 2.0 * (self._points @ question)
            nearest = np.argpartition(distance, k - 1)[:k]
            rows.append(known_mean(self._right[nearest], self._known[nearest], self._prior))
        return np.array(rows, dtype=np.float64).reshape(len(embeddings), len(self.names))

    def picks(
        self,
        p_right: npt.NDArray[np.float64],
        cost: npt.NDArray[np.float64],
        cost_weight: float,
    ) -> npt.NDArray[np.intp]:
        """Per row of ``p_right`` and ``cost`` (questions, workers, from ``estimate``), the
        index in ``names`` of the worker ``choose`` picks when every worker is allowed: the
        training report's sweep."""
        return best_workers(p_right, cost, cost_weight)

    def choose(
        self,
        question: str,
        *,
        allowed: Collection[str] | None = None,
        cost_weight: float | None = None,
    ) -> RoutingDecision | None:
        """The best allowed worker for ``question``; None when the router knows none of them."""
        weight = self.model.cost_weight if cost_weight is None else cost_weight
        if weight < 0:
            raise ValueError("cost_weight must be >= 0")
        p, cost = self.estimate(self._embedder.embed([question]), [question])
        return self._decide(p[0], cost[0], allowed, weight)

    def _decide(
        self,
        p: npt.NDArray[np.float64],
        cost: npt.NDArray[np.float64],
        allowed: Collection[str] | None,
        weight: float,
    ) -> RoutingDecision | None:
        utility = p - weight * cost * PER_QUESTIONS
        scores = {
            name: WorkerScore(float(p[i]), float(cost[i]), float(utility[i]))
            for i, name in enumerate(self.names)
            if allowed is None or name in allowed
        }
        if not scores:
            return None
        # Ties go to the cheaper worker, then to the pool's order.
        best = max(scores, key=lambda n: (scores[n].utility, -scores[n].cost_usd))
        return RoutingDecision(worker=best, cost_weight=weight, scores=scores)


def best_workers(
    p_right: npt.NDArray[np.float64], cost: npt.NDArray[np.float64], cost_weight: float
) -> npt.NDArray[np.intp]:
    """Per row of ``p_right`` and ``cost`` (questions, workers), the column of the worker with
    the largest chance minus ``cost_weight`` times cost per 1,000 questions."""
    utility = p_right - cost_weight * cost * PER_QUESTIONS
    # Ties go to the worker cheaper on the question (its expected cost, which a domain head
    # makes differ by question), then to the pool's order: as ``choose`` breaks them.
    by_cost = np.argsort(cost, axis=1, kind="stable")
    first = np.take_along_axis(utility, by_cost, axis=1).argmax(axis=1)
    best: npt.NDArray[np.intp] = np.take_along_axis(by_cost, first[:, None], axis=1)[:, 0]
    return best


def mlp_logits(weights: MlpWeights, inputs: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """(questions, workers): one network's output, as torch computes it in eval mode (dropout
    off): Linear, GELU (the exact one, through erf), Linear."""
    hidden = inputs @ weights.hidden_weight.T.astype(np.float64) + weights.hidden_bias
    hidden = 0.5 * hidden * (1.0 + _erf(hidden / math.sqrt(2.0)))
    result: npt.NDArray[np.float64] = (
        hidden @ weights.output_weight.T.astype(np.float64) + weights.output_bias
    )
    return result


def mlp_chances(
    networks: Sequence[MlpWeights], inputs: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """(questions, workers): the mean over ``networks`` of each one's sigmoid chances."""
    chances = [sigmoid(mlp_logits(w, inputs)) for w in networks]
    result: npt.NDArray[np.float64] = np.mean(chances, axis=0)
    return result


def sigmoid(logits: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The chance a logistic head's logit stands for."""
    result: npt.NDArray[np.float64] = 1.0 / (1.0 + np.exp(-logits))
    return result


def _erf(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """math.erf element-wise (numpy has none; scipy is no serving dependency)."""
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=np.float64)


def domain_costs(heads: Sequence[WorkerHead], domains: int) -> npt.NDArray[np.float64]:
    """(domains, workers): each worker's mean cost per domain; a worker without costs per
    domain costs its mean in each. A question's expected costs are its domain chances times
    this."""
    per_worker = [h.domain_cost_usd or [h.cost_usd] * domains for h in heads]
    return np.array(per_worker, dtype=np.float64).reshape(len(heads), domains).T


def softmax(logits: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Row-wise softmax, shifted by each row's largest logit so that exp cannot overflow."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    result: npt.NDArray[np.float64] = shifted / shifted.sum(axis=1, keepdims=True)
    return result


def known_mean(
    right: npt.NDArray[np.float64], known: npt.NDArray[np.bool_], prior: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Per worker, the mean over the second-to-last axis of the known results; ``prior`` where
    none is known. On complete results, the plain mean."""
    sums, counts = np.where(known, right, 0.0).sum(axis=-2), known.sum(axis=-2)
    return np.where(counts > 0, sums / np.maximum(counts, 1), prior)
