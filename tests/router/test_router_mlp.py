"""The router's mlp head in its file: served as the mean of its networks' chances, and a file
whose networks disagree with it is refused with the reason.

Every table here is made by the test itself, seeded. The tests that train networks are marked
``training``; the others build networks from seeded random weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from conductor.errors import ConfigurationError
from conductor_router import (
    QUESTION_FEATURES,
    MlpNetwork,
    MlpWeights,
    Router,
    RouterModel,
    WorkerHead,
    load_router_model,
    mlp_logits,
    question_features,
    save_router_model,
)
from conductor_router.model import DomainHead

from fakes.embedder import HASH_DIM, HashEmbedder

FEATURES = len(QUESTION_FEATURES)
NAMES = ["alpha", "beta", "gamma"]
DOMAINS = ["code", "math"]
INPUTS = len(DOMAINS) + HASH_DIM + FEATURES


def random_weights(rng: np.random.Generator, inputs: int, workers: int) -> MlpWeights:
    def normal(*shape: int) -> npt.NDArray[np.float32]:
        return rng.normal(size=shape).astype(np.float32)

    return MlpWeights(normal(5, inputs), normal(5), normal(workers, 5), normal(workers))


def mlp_model(seed: int = 0, networks: int = 3) -> RouterModel:
    """An mlp router with a domain head of two domains and ``networks`` random networks."""
    rng = np.random.default_rng(seed)
    base = HASH_DIM + FEATURES
    return RouterModel(
        head="mlp",
        dim=HASH_DIM,
        features=list(QUESTION_FEATURES),
        feature_mean=rng.normal(size=FEATURES).tolist(),
        feature_scale=rng.uniform(0.5, 2, size=FEATURES).tolist(),
        domains=DomainHead(
            names=DOMAINS,
            coef=rng.normal(size=(len(DOMAINS), base)).tolist(),
            intercept=rng.normal(size=len(DOMAINS)).tolist(),
            weight=10.0,
        ),
        networks=[MlpNetwork.of(random_weights(rng, INPUTS, len(NAMES))) for _ in range(networks)],
        workers=[
            WorkerHead(
                name=name,
                cost_usd=float(rng.uniform(0.0001, 0.01)),
                domain_cost_usd=rng.uniform(0.0001, 0.01, size=len(DOMAINS)).tolist(),
                trained_on=100,
            )
            for name in NAMES
        ],
    )


# -- serving: numpy's forward pass is torch's ---------------------------------------------------


def test_an_mlp_file_serves_the_mean_of_its_networks_chances_over_the_heads_inputs(
    tmp_path: Path,
) -> None:
    # Given an mlp router file, saved and loaded
    model = mlp_model()
    path = tmp_path / "router.json"
    save_router_model(model, path)
    assert json.loads(path.read_text())["format"] == "conductor-router/4"
    router = Router.load(path, HashEmbedder())  # type: ignore[arg-type]
    questions = ["What is 12 times 7?", "def add(a, b):\n    return a + b", "Who wrote Ulysses?"]
    embeddings = HashEmbedder().embed(questions)
    # When it estimates
    p, cost = router.estimate(embeddings, questions)
    # Then the chances are the networks' mean over the domain chances (times the domain head's
    # weight), the embedding and the standardised text features, as the logistic heads read
    domains = model.domains
    assert domains is not None
    features = (question_features(questions) - model.feature_mean) / model.feature_scale
    base = np.hstack([embeddings, features])
    logits = base @ np.array(domains.coef).T + domains.intercept
    chances = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    inputs = np.hstack([chances * domains.weight, base])
    assert model.networks is not None
    expected = np.mean(
        [1 / (1 + np.exp(-mlp_logits(n.weights(), inputs))) for n in model.networks], axis=0
    )
    np.testing.assert_allclose(p, expected, rtol=1e-12)
    # ... and the expected costs are the domain costs weighted by the domain chances
    per_domain = np.array([w.domain_cost_usd for w in model.workers]).T
    np.testing.assert_allclose(cost, chances @ per_domain, rtol=1e-12)
    decision = router.choose(questions[0], cost_weight=0.0)
    assert decision is not None
    assert decision.worker == NAMES[int(np.argmax(p[0]))]


# -- the file: what is refused ------------------------------------------------------------------


def _mlp_json() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(mlp_model(networks=1).model_dump_json(exclude_none=True))
    return data


def _network(rng: np.random.Generator, inputs: int, workers: int, **changes: Any) -> Any:
    weights = random_weights(rng, inputs, workers)._replace(**changes)
    return json.loads(MlpNetwork.of(weights).model_dump_json())


RNG = np.random.default_rng(5)
BROKEN_MLP = [
    ({"networks": []}, "an mlp router needs at least one network"),
    ({"networks": None}, "an mlp router needs at least one network"),
    (
        {"networks": [_network(RNG, INPUTS - 1, len(NAMES))]},
        f"network 0: hidden_weight has shape [5, {INPUTS - 1}], expected [5, {INPUTS}]",
    ),
    (
        {"networks": [_network(RNG, INPUTS, len(NAMES) + 1)]},
        f"output_weight has shape [{len(NAMES) + 1}, 5], expected [{len(NAMES)}, 5]",
    ),
    (
        {
            "networks": [
                _network(RNG, INPUTS, len(NAMES), hidden_bias=np.zeros(4, dtype=np.float32))
            ]
        },
        "hidden_bias has shape [1, 4], expected [1, 5]",
    ),
    (
        {
            "networks": [
                _network(RNG, INPUTS, len(NAMES), output_bias=np.array([0, np.nan, 0], np.float32))
            ]
        },
        "weights must be finite numbers",
    ),
    ({"format": "conductor-router/3"}, "an mlp router needs format conductor-router/4"),
    ({"head": "logistic"}, "heads of alpha, beta, gamma do not have"),
    ({"head": "knn"}, "a knn router reads no text features"),
    ({"domains": None}, "domain_cost_usd needs 0 costs"),
]


@pytest.mark.parametrize(("change", "problem"), BROKEN_MLP)
def test_a_malformed_mlp_file_is_refused_with_the_reason(
    tmp_path: Path, change: dict[str, Any], problem: str
) -> None:
    data = _mlp_json()
    data.update(change)
    path = tmp_path / "router.json"
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    with pytest.raises(ConfigurationError, match=r"router file .*router\.json") as raised:
        load_router_model(path)
    assert problem in str(raised.value)


def test_an_mlp_head_with_coefficients_or_a_logistic_head_with_networks_is_refused(
    tmp_path: Path,
) -> None:
    data = _mlp_json()
    data["workers"][0]["coef"] = [0.0] * INPUTS
    data["workers"][0]["intercept"] = 0.0
    path = tmp_path / "router.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="heads of alpha have coefficients"):
        load_router_model(path)
    for worker in data["workers"]:
        worker |= {"coef": [0.0] * INPUTS, "intercept": 0.0}
    data["head"] = "logistic"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="a logistic router keeps no networks"):
        load_router_model(path)


def test_a_format_3_logistic_file_still_loads_and_routes_as_format_4_does(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(2)
    workers = [
        WorkerHead(
            name=name,
            coef=rng.normal(size=HASH_DIM + FEATURES).tolist(),
            intercept=0.1,
            cost_usd=0.001 * (i + 1),
            trained_on=10,
        )
        for i, name in enumerate(NAMES)
    ]
    current = RouterModel(
        dim=HASH_DIM,
        features=list(QUESTION_FEATURES),
        feature_mean=[0.0] * FEATURES,
        feature_scale=[1.0] * FEATURES,
        workers=workers,
    )
    path = tmp_path / "router.json"
    path.write_text(current.model_dump_json().replace("conductor-router/4", "conductor-router/3"))
    old = Router.load(path, HashEmbedder())  # type: ignore[arg-type]
    assert old.model.format == "conductor-router/3"
    new = Router(current, HashEmbedder())  # type: ignore[arg-type]
    for question in ["one", "What is 2 + 2?", "Name a river."]:
        assert old.choose(question, cost_weight=0.5) == new.choose(question, cost_weight=0.5)
