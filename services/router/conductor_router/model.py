"""A trained router: a question's embedding -> per worker, the chance of a right answer and the
expected cost -> the worker that maximises chance minus ``cost_weight`` times cost, among the
workers a request may use.

The chance comes from one of three kinds of head, named by the file's ``head``:

- ``logistic`` (the router): per worker a logistic regression trained by scikit-learn on that
  worker's right and wrong answers, reading the embedding and a few standardised features of
  the question's text (conductor_router.text_features);
- ``knn`` (a baseline): per worker the mean share of right answers of the ``neighbours``
  training questions nearest in the embedding, over those whose result for the worker is known
  (none known: the worker's mean over all training questions);
- ``cluster`` (a baseline, as Avengers-Pro routes): per worker the share of right answers of
  the training questions of the nearest k-means centroid.

Each worker is scored on its own, so any subset of the pool is scored exactly as the full pool
is: a worker left out changes nothing about the others' scores. The file is JSON (coefficients,
or embeddings packed as base64; never a pickle, so loading a router file runs no code from it);
a file that is not a router of a known version, or whose shapes disagree, is refused with the
reason.

Cost is in USD per 1,000 questions, so ``cost_weight`` reads as: how much chance of a right
answer one would give up to save a dollar per thousand questions (0: accuracy only).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from conductor.errors import ConfigurationError, validation_problems
from conductor_router.embedding import EMBEDDER_NAME, ROUTER_INSTALL, QuestionEmbedder
from conductor_router.packed_array import PackedArray
from conductor_router.text_features import QUESTION_FEATURES, question_features

ROUTER_FORMAT = "conductor-router/2"
# Version 1: the embedding only (no text features); still served as it was.
ROUTER_FORMATS = ("conductor-router/1", ROUTER_FORMAT)
PER_QUESTIONS = 1000  # cost is expressed per this many questions
HeadKind = Literal["logistic", "knn", "cluster"]


class WorkerHead(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    coef: list[float] | None = None  # logistic only
    intercept: float | None = None  # logistic only
    # Mean cost of one question answered by this worker alone, in training, USD.
    cost_usd: float = Field(ge=0)
    trained_on: int = Field(ge=0)  # questions this head learnt from


class RouterModel(BaseModel):
    """What ``conductor router train`` writes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["conductor-router/1", "conductor-router/2"] = "conductor-router/2"
    head: HeadKind = "logistic"  # files from before the baselines were routers are logistic
    embedder: str = EMBEDDER_NAME
    dim: int = Field(gt=0)
    # Text features read after the embedding (names from QUESTION_FEATURES), standardised with
    # the training items' mean and scale. Logistic heads only.
    features: list[str] = Field(default_factory=list)
    feature_mean: list[float] = Field(default_factory=list)
    feature_scale: list[float] = Field(default_factory=list)
    # knn: the training questions' embeddings; cluster: the centroids. (points, dim)
    points: PackedArray | None = None
    # Per point and worker (the workers' order), the share of right answers: NaN where the
    # worker's result is unknown (knn; a cluster's shares are all known).
    right: PackedArray | None = None
    neighbours: int | None = Field(default=None, gt=0)  # knn: how many points are averaged
    cost_weight: float = Field(default=0.0, ge=0)  # the default when a request gives none
    workers: list[WorkerHead] = Field(min_length=1)
    trained: dict[str, Any] = Field(default_factory=dict)  # provenance: suites, items, date

    @model_validator(mode="after")
    def _consistent(self) -> RouterModel:
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            raise ValueError(f"worker names repeat: {names}")
        if self.head == "logistic":
            self._logistic_consistent()
        else:
            self._table_consistent()
        return self

    def _logistic_consistent(self) -> None:
        unknown = sorted(set(self.features) - set(QUESTION_FEATURES))
        if unknown:
            raise ValueError(f"unknown text features {unknown}; known: {list(QUESTION_FEATURES)}")
        n = len(self.features)
        if len(self.feature_mean) != n or len(self.feature_scale) != n:
            raise ValueError(f"feature_mean and feature_scale need {n} values each")
        if any(not scale > 0 for scale in self.feature_scale):
            raise ValueError("feature_scale values must be > 0")
        inputs = self.dim + n
        wrong = [w.name for w in self.workers if w.coef is None or len(w.coef) != inputs]
        if wrong:
            raise ValueError(
                f"heads of {', '.join(wrong)} do not have {inputs} coefficients "
                f"({self.dim} embedding dimensions + {n} text features)"
            )
        if missing := [w.name for w in self.workers if w.intercept is None]:
            raise ValueError(f"heads of {', '.join(missing)} have no intercept")
        if self.points is not None or self.right is not None or self.neighbours is not None:
            raise ValueError(
                "a logistic router keeps no points, right or neighbours (knn and "
                "cluster routers do)"
            )

    def _table_consistent(self) -> None:
        """knn and cluster: points and their right-shares, shapes agreeing with the workers."""
        head = self.head
        if self.features or self.feature_mean or self.feature_scale:
            raise ValueError(f"a {head} router reads no text features")
        if coefficients := [
            w.name for w in self.workers if w.coef is not None or w.intercept is not None
        ]:
            raise ValueError(
                f"a {head} router has no coefficients; heads of {', '.join(coefficients)} do"
            )
        if self.points is None or self.right is None:
            raise ValueError(f"a {head} router needs its points and their right shares")
        rows, dim = self.points.shape
        if rows == 0 or dim != self.dim:
            raise ValueError(
                f"points have shape {list(self.points.shape)}; a {head} router needs "
                f"(at least 1, {self.dim}): one row per point of {self.dim} dimensions"
            )
        if not np.isfinite(self.points.array()).all():
            raise ValueError("points must be finite numbers (no NaN or infinity)")
        if self.right.shape != (rows, len(self.workers)):
            raise ValueError(
                f"right has shape {list(self.right.shape)}, expected "
                f"[{rows}, {len(self.workers)}]: one row per point, one column per worker"
            )
        shares = self.right.array()
        known = ~np.isnan(shares)
        if ((shares[known] < 0) | (shares[known] > 1)).any():
            raise ValueError("right shares must lie between 0 and 1")
        if head == "cluster" and not known.all():
            raise ValueError("a cluster router's right shares must all be known (no NaN)")
        if head == "knn" and (self.neighbours is None or self.neighbours > rows):
            raise ValueError(f"a knn router needs neighbours between 1 and its {rows} points")
        if head == "cluster" and self.neighbours is not None:
            raise ValueError("a cluster router has no neighbours (knn routers do)")


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
        # The workers cheapest first (pool order among equals): the order ties are broken in.
        self._by_cost = np.argsort(self._cost, kind="stable")
        if model.head == "logistic":
            self._coef = np.array([w.coef for w in model.workers], dtype=np.float64)
            self._intercept = np.array([w.intercept for w in model.workers], dtype=np.float64)
            self._feature_columns = [QUESTION_FEATURES.index(name) for name in model.features]
            self._feature_mean = np.array(model.feature_mean, dtype=np.float64)
            self._feature_scale = np.array(model.feature_scale, dtype=np.float64)
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
        if self.model.head != "logistic":
            return self._from_nearest_points(embeddings)
        inputs = embeddings.astype(np.float64)
        if self._feature_columns:
            raw = question_features(questions)[:, self._feature_columns]
            inputs = np.hstack([inputs, (raw - self._feature_mean) / self._feature_scale])
        logits = inputs @ self._coef.T + self._intercept
        return 1.0 / (1.0 + np.exp(-logits))

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

    def picks(self, p_right: npt.NDArray[np.float64], cost_weight: float) -> npt.NDArray[np.intp]:
        """Per row of ``p_right`` (questions, workers), the index in ``names`` of the worker
        ``choose`` picks when every worker is allowed: the training report's sweep."""
        utility = self._utility(p_right, cost_weight)
        best: npt.NDArray[np.intp] = self._by_cost[utility[:, self._by_cost].argmax(axis=1)]
        return best

    def _utility(self, p: npt.NDArray[np.float64], weight: float) -> npt.NDArray[np.float64]:
        return p - weight * self._cost * PER_QUESTIONS

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
        p = self.p_right(self._embedder.embed([question]), [question])[0]
        return self._decide(p, allowed, weight)

    def _decide(
        self, p: npt.NDArray[np.float64], allowed: Collection[str] | None, weight: float
    ) -> RoutingDecision | None:
        utility = self._utility(p, weight)
        scores = {
            name: WorkerScore(float(p[i]), float(self._cost[i]), float(utility[i]))
            for i, name in enumerate(self.names)
            if allowed is None or name in allowed
        }
        if not scores:
            return None
        # Ties go to the cheaper worker, then to the pool's order.
        best = max(scores, key=lambda n: (scores[n].utility, -scores[n].cost_usd))
        return RoutingDecision(worker=best, cost_weight=weight, scores=scores)


def known_mean(
    right: npt.NDArray[np.float64], known: npt.NDArray[np.bool_], prior: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Per worker, the mean over the second-to-last axis of the known results; ``prior`` where
    none is known. On complete results, the plain mean."""
    sums, counts = np.where(known, right, 0.0).sum(axis=-2), known.sum(axis=-2)
    return np.where(counts > 0, sums / np.maximum(counts, 1), prior)


def load_router_model(path: Path) -> RouterModel:
    """The router in ``path``; a ConfigurationError saying what is wrong otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"router file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"router file {path}: not a router (not UTF-8 text)") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"router file {path}: not a router (invalid JSON at line {exc.lineno}: {exc.msg})"
        ) from exc
    if not isinstance(data, dict) or data.get("format") not in ROUTER_FORMATS:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ConfigurationError(
            f"router file {path}: format {found!r}, expected {ROUTER_FORMAT!r} (train one with "
            f"`conductor router train`; routing needs `{ROUTER_INSTALL}`)"
        )
    try:
        return RouterModel.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, whole="file", plain=True)
        raise ConfigurationError(f"router file {path}: {problems}") from exc


def save_router_model(model: RouterModel, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # Unset optional fields (a logistic router's points, a knn head's coefficients) are left out.
    tmp.write_text(model.model_dump_json(indent=1, exclude_none=True), encoding="utf-8")
    tmp.replace(path)
