"""A router file: what ``conductor router train`` writes and serving loads.

A file holds one of four kinds of head, named by its ``head``:

- ``logistic`` (the router): per worker the coefficients of a logistic regression over the
  question's embedding and a few standardised features of its text (``text_features``) and,
  where it learnt from several domains, a domain head: which domain the question is from
  (a multinomial logistic regression over the same inputs), whose chances the workers' heads
  read first, and each worker's mean cost per domain;
- ``mlp`` (the router, where cross-validation preferred it): the same inputs, domain head and
  costs, read by small networks of one hidden layer (GELU) with one output per worker, whose
  chances are averaged (``networks``: their weights packed as base64, since version 4);
- ``knn`` (a baseline): the training questions' embeddings and, per question and worker, the
  share of right answers (NaN where unknown), with how many nearest questions are averaged;
- ``cluster`` (a baseline, as Avengers-Pro routes): k-means centroids of the training questions
  and per centroid and worker the share of right answers.

Every head keeps its worker's mean cost per question. The file is JSON (coefficients, or
weights and embeddings packed as base64; never a pickle, so loading a router file runs no code
from it); a file that is not a router of a known version, or whose shapes disagree, is refused
with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, get_args

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from conductor.errors import ConfigurationError, validation_problems
from conductor_router.embedding import EMBEDDER_NAME, ROUTER_INSTALL
from conductor_router.packed_array import PackedArray
from conductor_router.text_features import QUESTION_FEATURES

ROUTER_FORMAT: Final = "conductor-router/4"
# Version 1: the embedding only (no text features); 2: no domain head; 3: no mlp head. All
# still served as they were.
FormatName = Literal[
    "conductor-router/1", "conductor-router/2", "conductor-router/3", "conductor-router/4"
]
ROUTER_FORMATS: tuple[str, ...] = get_args(FormatName)
PER_QUESTIONS = 1000  # cost is expressed per this many questions
HeadKind = Literal["logistic", "mlp", "knn", "cluster"]


class WorkerHead(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    coef: list[float] | None = None  # logistic only
    intercept: float | None = None  # logistic only
    # Mean cost of one question answered by this worker alone, in training, USD.
    cost_usd: float = Field(ge=0)
    # With a domain head: the mean cost per domain (the domains' order), USD. A question's
    # expected cost is these weighted by its domain chances: a long coding answer costs more
    # than a letter, and the trade-off should know it.
    domain_cost_usd: list[float] | None = None
    trained_on: int = Field(ge=0)  # questions this head learnt from


class DomainHead(BaseModel):
    """Which domain a question is from: a multinomial logistic regression over the embedding
    and the text features. Routing learns it from the domain each training question carries
    (its benchmark, its outcome table's domain); serving has only the question."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    names: list[str] = Field(min_length=2)
    coef: list[list[float]]  # (domains, embedding dimensions + text features)
    intercept: list[float]
    # The worker heads read the domain chances times this, ahead of the embedding: larger than
    # the embedding's unit-length values, so their regularisation holds them back less.
    weight: float = Field(gt=0)


class MlpWeights(NamedTuple):
    """One network's weights as arrays (float32): what fitting makes and serving reads."""

    hidden_weight: npt.NDArray[np.float32]  # (hidden, inputs)
    hidden_bias: npt.NDArray[np.float32]  # (hidden,)
    output_weight: npt.NDArray[np.float32]  # (workers, hidden)
    output_bias: npt.NDArray[np.float32]  # (workers,)


class MlpNetwork(BaseModel):
    """One network of an ``mlp`` head: inputs -> Linear -> GELU -> Linear -> one logit per
    worker. Weights are float32, as trained."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden_weight: PackedArray  # (hidden, inputs)
    hidden_bias: PackedArray  # (1, hidden)
    output_weight: PackedArray  # (workers, hidden)
    output_bias: PackedArray  # (1, workers)

    @classmethod
    def of(cls, weights: MlpWeights) -> MlpNetwork:
        return cls(
            hidden_weight=PackedArray.of(weights.hidden_weight, "float32"),
            hidden_bias=PackedArray.of(weights.hidden_bias[None, :], "float32"),
            output_weight=PackedArray.of(weights.output_weight, "float32"),
            output_bias=PackedArray.of(weights.output_bias[None, :], "float32"),
        )

    def weights(self) -> MlpWeights:
        return MlpWeights(
            self.hidden_weight.array(),
            self.hidden_bias.array()[0],
            self.output_weight.array(),
            self.output_bias.array()[0],
        )

    def problem(self, inputs: int, workers: int) -> str | None:
        """What is wrong with the network's shapes or values for ``inputs`` and ``workers``;
        None when nothing is."""
        hidden = self.hidden_weight.shape[0]
        expected = {
            "hidden_weight": (hidden, inputs),
            "hidden_bias": (1, hidden),
            "output_weight": (workers, hidden),
            "output_bias": (1, workers),
        }
        for name, shape in expected.items():
            found = getattr(self, name).shape
            if found != shape or min(shape) == 0:
                return (
                    f"{name} has shape {list(found)}, expected {list(shape)} ({hidden} hidden "
                    f"units, {inputs} inputs, {workers} workers)"
                )
        if not all(np.isfinite(getattr(self, name).array()).all() for name in expected):
            return "weights must be finite numbers (no NaN or infinity)"
        return None


class RouterModel(BaseModel):
    """What ``conductor router train`` writes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: FormatName = ROUTER_FORMAT
    head: HeadKind = "logistic"  # files from before the baselines were routers are logistic
    embedder: str = EMBEDDER_NAME
    dim: int = Field(gt=0)
    # Text features read after the embedding (names from QUESTION_FEATURES), standardised with
    # the training items' mean and scale. Logistic and mlp heads only.
    features: list[str] = Field(default_factory=list)
    feature_mean: list[float] = Field(default_factory=list)
    feature_scale: list[float] = Field(default_factory=list)
    domains: DomainHead | None = None  # logistic and mlp only
    # mlp: the networks whose chances are averaged (format 4 on).
    networks: list[MlpNetwork] | None = None
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
        elif self.head == "mlp":
            self._mlp_consistent()
        else:
            self._table_consistent()
        return self

    def _logistic_consistent(self) -> None:
        inputs, domains = self._inputs_consistent()
        n = len(self.features)
        wrong = [w.name for w in self.workers if w.coef is None or len(w.coef) != inputs]
        if wrong:
            raise ValueError(
                f"heads of {', '.join(wrong)} do not have {inputs} coefficients ({domains} "
                f"domains + {self.dim} embedding dimensions + {n} text features)"
            )
        if missing := [w.name for w in self.workers if w.intercept is None]:
            raise ValueError(f"heads of {', '.join(missing)} have no intercept")
        if self.networks is not None:
            raise ValueError("a logistic router keeps no networks (mlp routers do)")

    def _mlp_consistent(self) -> None:
        if ROUTER_FORMATS.index(self.format) < ROUTER_FORMATS.index("conductor-router/4"):
            raise ValueError(f"an mlp router needs format conductor-router/4, not {self.format}")
        inputs, _ = self._inputs_consistent()
        if coefficients := [
            w.name for w in self.workers if w.coef is not None or w.intercept is not None
        ]:
            raise ValueError(
                f"an mlp router keeps its weights in networks; heads of "
                f"{', '.join(coefficients)} have coefficients"
            )
        if not self.networks:
            raise ValueError("an mlp router needs at least one network")
        for i, network in enumerate(self.networks):
            if problem := network.problem(inputs, len(self.workers)):
                raise ValueError(f"network {i}: {problem}")

    def _inputs_consistent(self) -> tuple[int, int]:
        """Logistic and mlp: the text features, the domain head and the costs per domain agree;
        how many inputs the heads read, and how many of them are domain chances."""
        unknown = sorted(set(self.features) - set(QUESTION_FEATURES))
        if unknown:
            raise ValueError(f"unknown text features {unknown}; known: {list(QUESTION_FEATURES)}")
        n = len(self.features)
        if len(self.feature_mean) != n or len(self.feature_scale) != n:
            raise ValueError(f"feature_mean and feature_scale need {n} values each")
        if any(not scale > 0 for scale in self.feature_scale):
            raise ValueError("feature_scale values must be > 0")
        base = self.dim + n
        domains = 0 if self.domains is None else len(self.domains.names)
        if self.domains is not None:
            self._domains_consistent(self.domains, base)
        costs = [w.domain_cost_usd for w in self.workers]
        # ``not >= 0`` refuses NaN too (a NaN cost would make every utility NaN).
        if any(c is not None and (len(c) != domains or not all(x >= 0 for x in c)) for c in costs):
            raise ValueError(f"domain_cost_usd needs {domains} costs >= 0, one per domain")
        if self.points is not None or self.right is not None or self.neighbours is not None:
            raise ValueError(
                f"a {self.head} router keeps no points, right or neighbours (knn and "
                "cluster routers do)"
            )
        return domains + base, domains

    @staticmethod
    def _domains_consistent(head: DomainHead, inputs: int) -> None:
        if len(set(head.names)) != len(head.names):
            raise ValueError(f"domain names repeat: {head.names}")
        rows = len(head.names)
        if len(head.intercept) != rows or any(len(row) != inputs for row in head.coef):
            raise ValueError(
                f"the domain head needs {rows} intercepts and {rows} rows of {inputs} "
                "coefficients (embedding dimensions + text features)"
            )
        if len(head.coef) != rows:
            raise ValueError(f"the domain head needs {rows} rows of coefficients")

    def _table_consistent(self) -> None:
        """knn and cluster: points and their right-shares, shapes agreeing with the workers."""
        head = self.head
        if self.features or self.feature_mean or self.feature_scale or self.domains:
            raise ValueError(f"a {head} router reads no text features and no domain head")
        if self.networks is not None:
            raise ValueError(f"a {head} router keeps no networks (mlp routers do)")
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
