"""The router's mlp head: serving's numpy forward pass is torch's, a file whose networks
disagree with it is refused with the reason, and ``auto`` keeps the head with the larger
cross-validated area under the accuracy/cost curve.

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
    fit_routers,
    load_router_model,
    mlp_chances,
    mlp_logits,
    question_features,
    save_router_model,
)
from conductor_router.model import DomainHead
from conductor_trainer.router_mlp import (
    MLP_HIDDEN,
    MLP_SEEDS,
    TorchMlpFitter,
    build_network,
    network_weights,
)

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


def test_the_numpy_forward_pass_is_torchs_in_eval_mode() -> None:
    import torch

    # Given three networks as the trainer builds them, from seeded random weights
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(50, INPUTS))
    networks = []
    weights = []
    for seed in MLP_SEEDS:
        torch.manual_seed(seed)
        network = build_network(INPUTS, len(NAMES))
        with torch.no_grad():  # biases away from their initial values too
            for parameter in network.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.5)
        network.eval()
        networks.append(network)
        weights.append(network_weights(network))
    # When numpy and torch (eval mode: dropout off) compute each network's output
    with torch.no_grad():
        x = torch.as_tensor(inputs, dtype=torch.float32)
        logits = [n(x).double().numpy() for n in networks]
        chances = np.mean([torch.sigmoid(n(x)).double().numpy() for n in networks], axis=0)
        exact = [n.double()(torch.as_tensor(inputs)).numpy() for n in networks]
    # Then they agree to 1e-5, network by network and on the mean of the chances; and to
    # rounding with torch in float64 (serving computes in float64 from the float32 weights)
    for w, expected, in_float64 in zip(weights, logits, exact, strict=True):
        np.testing.assert_allclose(mlp_logits(w, inputs), expected, rtol=0, atol=1e-5)
        np.testing.assert_allclose(mlp_logits(w, inputs), in_float64, rtol=0, atol=1e-10)
    np.testing.assert_allclose(mlp_chances(weights, inputs), chances, rtol=0, atol=1e-5)


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


# -- choosing the head by cross-validation ------------------------------------------------------


class ConstantFitter:
    """An MlpFitter whose one network says 0.5 for every worker on every question: no head
    could route worse by chance. Counts its calls."""

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {"kind": "constant"}
        self.calls: list[int] = []

    def __call__(
        self, inputs: npt.NDArray[np.float64], right: npt.NDArray[np.float64]
    ) -> list[MlpWeights]:
        self.calls.append(len(inputs))
        workers = right.shape[1]
        zeros = np.zeros
        return [
            MlpWeights(
                zeros((2, inputs.shape[1]), np.float32),
                zeros(2, np.float32),
                zeros((workers, 2), np.float32),
                zeros(workers, np.float32),
            )
        ]


def routing_arrays(
    n: int, planted: str, seed: int = 1
) -> tuple[list[str], npt.NDArray[np.float32], dict[str, Any]]:
    """``n`` questions (the last 100 held out) and two workers of slightly different cost:
    alpha right where the embedding's first coordinate is positive (``planted="linear"``) or
    where the first two have the same sign (``"xor"``, which no linear head can read), beta
    right elsewhere."""
    rng = np.random.default_rng(seed)
    embeddings = (rng.normal(size=(n, HASH_DIM)) * 2).astype(np.float32)
    first, second = embeddings[:, 0], embeddings[:, 1]
    alpha = first > 0 if planted == "linear" else first * second > 0
    arrays = {
        "workers": ["alpha", "beta"],
        "right": np.stack([alpha, ~alpha], axis=1).astype(np.float64),
        "cost": np.tile([0.001, 0.00001], (n, 1)),
        "train": np.arange(n) < n - 100,
    }
    return [f"question {i}" for i in range(n)], embeddings, arrays


def test_auto_keeps_the_logistic_head_where_its_cross_validated_area_is_larger() -> None:
    # Given 600 training questions where a linear head reads who is right, and an mlp whose
    # network knows nothing
    questions, embeddings, arrays = routing_arrays(700, "linear")
    fitter = ConstantFitter()
    stages: set[str] = set()
    # When the router's head is chosen by cross-validation
    models = fit_routers(
        questions,
        embeddings,
        embedder=HashEmbedder(),  # type: ignore[arg-type]
        head="auto",
        mlp=fitter,
        progress=lambda stage, done, total: stages.add(stage),
        **arrays,
    )
    # Then both heads were scored on the 5 folds (the mlp trained on four fifths of the 600
    # each time), the logistic head scored higher, and the router is logistic
    router = models["router"]
    trained = router.trained
    assert fitter.calls == [480] * 5
    assert (trained["head_choice"], trained["head_cv_folds"]) == ("auto", 5)
    assert trained["head_cv_measure"] == "area"
    areas = trained["head_cv"]
    assert areas["logistic"] > areas["mlp"] + 0.05, areas
    assert (trained["head"], router.head) == ("logistic", "logistic")
    assert "mlp" not in trained
    assert {"choosing the regularisation", "cross-validating the mlp head"} <= stages


def test_where_every_worker_costs_the_same_the_heads_are_compared_on_accuracy() -> None:
    # Given one price for both workers on every question (a table that records no cost): the
    # accuracy/cost curve is a single point, whose area is 0 for any head
    questions, embeddings, arrays = routing_arrays(700, "linear")
    arrays["cost"] = np.full_like(arrays["cost"], 0.001)
    # When the head is chosen
    models = fit_routers(
        questions,
        embeddings,
        embedder=HashEmbedder(),  # type: ignore[arg-type]
        head="auto",
        mlp=ConstantFitter(),
        **arrays,
    )
    # Then the heads are scored on their accuracy in the folds: the logistic head reads who is
    # right, the constant network is right half the time
    trained = models["router"].trained
    assert trained["head_cv_measure"] == "accuracy"
    scores = trained["head_cv"]
    assert scores["logistic"] > 0.9, scores
    assert scores["mlp"] == pytest.approx(0.5, abs=0.06)
    assert trained["head"] == "logistic"


def test_auto_with_too_few_training_items_to_fold_keeps_the_logistic_head() -> None:
    questions, embeddings, arrays = routing_arrays(599, "linear")  # 499 training questions
    fitter = ConstantFitter()
    models = fit_routers(
        questions,
        embeddings,
        embedder=HashEmbedder(),  # type: ignore[arg-type]
        head="auto",
        mlp=fitter,
        **arrays,
    )
    trained = models["router"].trained
    assert (models["router"].head, trained["head_cv_folds"], trained["head_cv"]) == (
        "logistic",
        0,
        {},
    )
    assert fitter.calls == []


def test_asked_for_the_mlp_head_the_router_is_mlp_with_the_fitters_networks() -> None:
    questions, embeddings, arrays = routing_arrays(700, "linear")
    fitter = ConstantFitter()
    models = fit_routers(
        questions,
        embeddings,
        embedder=HashEmbedder(),  # type: ignore[arg-type]
        head="mlp",
        mlp=fitter,
        **arrays,
    )
    router = models["router"]
    # Scored on the folds (five fits), then trained on all 600 training questions
    assert fitter.calls == [480] * 5 + [600]
    assert router.head == "mlp"
    assert router.networks is not None
    assert len(router.networks) == 1
    assert router.trained["mlp"] == {"kind": "constant"}
    assert set(router.trained["head_cv"]) == {"mlp"}
    assert "head_c" not in router.trained  # no logistic head was fitted
    assert all(w.coef is None for w in router.workers)
    served = Router(router, HashEmbedder())  # type: ignore[arg-type]
    p, _ = served.estimate(embeddings[:3], questions[:3])
    np.testing.assert_allclose(p, 0.5)


def test_a_head_that_is_not_known_is_refused() -> None:
    questions, embeddings, arrays = routing_arrays(120, "linear")
    with pytest.raises(ConfigurationError, match="unknown head 'forest'"):
        fit_routers(
            questions,
            embeddings,
            embedder=HashEmbedder(),  # type: ignore[arg-type]
            head="forest",  # type: ignore[arg-type]
            **arrays,
        )


def test_conductor_router_train_refuses_a_head_it_does_not_know(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from conductor_cli import app

    done = CliRunner().invoke(
        app, ["router", "train", "--table", str(tmp_path / "t.jsonl"), "--head", "forest"]
    )
    assert isinstance(done.exception, ConfigurationError)
    assert str(done.exception) == "--head 'forest': expected one of logistic, mlp, auto"


@pytest.mark.training
def test_auto_keeps_the_mlp_head_where_only_a_network_can_read_who_is_right() -> None:
    # Given 2,400 training questions where alpha is right when the embedding's first two coordinates
    # have the same sign (an XOR: a linear head sees nothing)
    questions, embeddings, arrays = routing_arrays(2500, "xor")
    # When the head is chosen between the logistic heads and the trainer's networks
    models = fit_routers(
        questions,
        embeddings,
        embedder=HashEmbedder(),  # type: ignore[arg-type]
        head="auto",
        mlp=TorchMlpFitter(),
        **arrays,
    )
    # Then the mlp's cross-validated area is the larger, and the router is an mlp of three
    # networks of 64 hidden units, right on more than 80% of the 100 held-out questions (one
    # worker alone: about 50%)
    router = models["router"]
    areas = router.trained["head_cv"]
    assert areas["mlp"] > areas["logistic"] + 0.1, areas
    assert router.head == router.trained["head"] == "mlp"
    assert router.networks is not None
    shapes = [n.hidden_weight.shape for n in router.networks]
    assert shapes == [(MLP_HIDDEN, HASH_DIM + FEATURES)] * len(MLP_SEEDS)
    assert router.trained["mlp"] == TorchMlpFitter().settings
    held = ~arrays["train"]
    served = Router(router, HashEmbedder())  # type: ignore[arg-type]
    p, _ = served.estimate(embeddings[held], [q for q, h in zip(questions, held, strict=True) if h])
    picked_right = arrays["right"][held][np.arange(held.sum()), p.argmax(axis=1)]
    assert picked_right.mean() > 0.8


@pytest.mark.training
def test_the_networks_train_the_same_twice_and_leave_torchs_random_state_alone() -> None:
    import torch

    rng = np.random.default_rng(4)
    inputs = rng.normal(size=(300, 12))
    right = (rng.random((300, 3)) < 0.6).astype(np.float64)
    right[rng.random(right.shape) < 0.2] = np.nan  # not recorded: no loss
    torch.manual_seed(123)
    before = torch.random.get_rng_state()

    first, second = TorchMlpFitter()(inputs, right), TorchMlpFitter()(inputs, right)

    assert torch.equal(torch.random.get_rng_state(), before)
    assert len(first) == len(MLP_SEEDS)
    for a, b in zip(first, second, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    # Different seeds, different networks
    assert not np.array_equal(first[0].hidden_weight, first[1].hidden_weight)
