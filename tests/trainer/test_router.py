"""conductor-mini's router: it picks only allowed workers, refuses a bad file with the reason,
and chooses in serving exactly as training measured it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.errors import ConfigurationError
from conductor_adapters.router import (
    Router,
    RouterModel,
    WorkerHead,
    load_router_model,
    save_router_model,
)
from conductor_trainer.router import curve_area

from fakes.cli import run_conductor

DIM = 8
NAMES = ["alpha", "beta", "gamma", "delta", "epsilon"]


class HashEmbedder:
    """A stand-in for WordLlama: a fixed unit vector per text, no model."""

    name = "wordllama-l2-256"
    dim = DIM

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
            v = np.random.default_rng(seed).normal(size=DIM)
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, dtype=np.float32)


def model(seed: int = 0) -> RouterModel:
    rng = np.random.default_rng(seed)
    return RouterModel(
        dim=DIM,
        workers=[
            WorkerHead(
                name=name,
                coef=rng.normal(size=DIM).tolist(),
                intercept=float(rng.normal()),
                cost_usd=float(rng.uniform(0.00005, 0.01)),
                trained_on=100,
            )
            for name in NAMES
        ],
    )


ROUTER = Router(model(), HashEmbedder())  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    question=st.text(min_size=1, max_size=200),
    allowed=st.sets(st.sampled_from([*NAMES, "not-in-the-router"])),
    weight=st.floats(min_value=0, max_value=5),
)
def test_only_an_allowed_worker_is_ever_chosen(
    question: str, allowed: set[str], weight: float
) -> None:
    decision = ROUTER.choose(question, allowed=allowed, cost_weight=weight)
    known = allowed & set(NAMES)
    if not known:
        assert decision is None  # nothing it may pick: the caller falls back
        return
    assert decision is not None
    assert decision.worker in known
    assert set(decision.scores) == known
    best = max(s.utility for s in decision.scores.values())
    assert decision.scores[decision.worker].utility == best


def test_a_higher_cost_weight_never_picks_a_dearer_worker() -> None:
    questions = [f"question {n}" for n in range(50)]
    for question in questions:
        costs = [
            ROUTER.model.workers[NAMES.index(d.worker)].cost_usd
            for w in (0.0, 0.1, 1.0, 10.0)
            if (d := ROUTER.choose(question, cost_weight=w)) is not None
        ]
        assert costs == sorted(costs, reverse=True)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
        (b"{not json", "invalid JSON at line 1"),
        (b"[1, 2]", "format 'list', expected 'conductor-router/1'"),
        (b'{"format": "conductor-router/0"}', "format 'conductor-router/0'"),
        (b'{"format": "conductor-router/1", "dim": 8, "workers": []}', "workers"),
    ],
)
def test_a_file_that_is_not_a_router_is_refused_with_the_reason(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "router.json"
    path.write_bytes(content)
    with pytest.raises(ConfigurationError, match=r"router file .*router\.json") as raised:
        load_router_model(path)
    assert problem in str(raised.value)


def test_a_router_whose_shapes_disagree_is_refused(tmp_path: Path) -> None:
    data = json.loads(model().model_dump_json())
    data["workers"][1]["coef"] = data["workers"][1]["coef"][:-1]
    path = tmp_path / "router.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="heads of beta do not have 8 coefficients"):
        load_router_model(path)
    data["workers"][1]["coef"].append(0.0)
    data["workers"][3]["name"] = "alpha"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="worker names repeat"):
        load_router_model(path)
    with pytest.raises(ConfigurationError, match="No such file"):
        load_router_model(tmp_path / "absent.json")


def test_a_router_for_another_embedder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    save_router_model(model().model_copy(update={"embedder": "minilm-l6"}), path)
    with pytest.raises(ConfigurationError, match="trained on minilm-l6"):
        Router.load(path, HashEmbedder())  # type: ignore[arg-type]


def test_saved_and_loaded_the_router_chooses_the_same(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    save_router_model(ROUTER.model, path)
    loaded = Router.load(path, HashEmbedder())  # type: ignore[arg-type]
    for n in range(30):
        before = ROUTER.choose(f"q{n}", cost_weight=0.05)
        after = loaded.choose(f"q{n}", cost_weight=0.05)
        assert before is not None
        assert after is not None
        assert (before.worker, before.scores) == (after.worker, after.scores)


def test_the_curve_area_takes_the_best_accuracy_at_each_cost() -> None:
    # Nothing below cost 1, 0.5 from 1 to 2, then 0.8 (0.7 at 3 is no better) up to 4.
    points = [(1.0, 0.5), (2.0, 0.8), (3.0, 0.7)]
    assert curve_area(points, 4.0) == pytest.approx((1 * 0.5 + 2 * 0.8) / 4)
    assert curve_area([], 4.0) == 0.0


@pytest.mark.model
@pytest.mark.processes
def test_router_train_learns_from_an_evaluation_and_serves_what_it_measured(
    tmp_path: Path,
) -> None:
    """``conductor eval`` on the simulated pool, then ``conductor router train``: the router
    file loads, and choosing for each held-out question one at a time (as serving does) gives
    the accuracy the training report measured for the router at the same cost weight."""
    evaluated = tmp_path / "eval"
    done = run_conductor(
        "eval",
        "--pool",
        "sim",
        "--suite",
        "gsm8k,mmlu,mbpp",
        "--limit",
        "60",
        "--strategies",
        "single:*",
        "--concurrency",
        "16",
        "--out",
        str(evaluated),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    router_file = tmp_path / "router.json"
    trained = run_conductor(
        "router", "train", str(evaluated), "--out", str(router_file), "--cost-weight", "0.02"
    )
    assert trained.returncode == 0, trained.stderr
    assert "held-out items" in trained.stderr
    report = json.loads((tmp_path / "router.report.json").read_text())
    router = Router.load(router_file)
    assert router.model.cost_weight == 0.02
    assert set(router.names) == {"sim-frontier", "sim-math", "sim-coder", "sim-small"}

    from conductor_evaluation import is_held_out
    from conductor_trainer.router import routing_data

    data = routing_data(evaluated)
    held = [
        (i, item)
        for i, item in enumerate(data.items)
        if is_held_out(item) and not np.isnan(data.right[i]).any()
    ]
    assert len(held) == report["held_out_items"]
    curve = next(c for c in report["curves"] if c["name"] == "router")
    for point in curve["points"][::6]:
        right = 0
        for i, item in held:
            decision = router.choose(item.question, cost_weight=point["cost_weight"])
            assert decision is not None
            right += int(data.right[i, data.workers.index(decision.worker)])
        assert right == point["correct"]
    refused = run_conductor("router", "train", str(tmp_path / "nothing"))
    assert refused.returncode == 2
    assert "no single-worker results" in refused.stderr
