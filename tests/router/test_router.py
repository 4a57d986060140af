"""conductor-mini's router: it picks only allowed workers, refuses a bad file with the reason,
and chooses in serving exactly as training measured it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI

from conductor.errors import ConfigurationError
from conductor.ports import PlanRequest
from conductor.workflow import PoolEntry
from conductor_evaluation import EvalItem, is_held_out
from conductor_planner import ConductorPlanner
from conductor_router import (
    EMBEDDER_NAME,
    QUESTION_FEATURES,
    HeadChoice,
    HeadKind,
    MlpNetwork,
    MlpWeights,
    PackedArray,
    Router,
    RouterModel,
    WorkerHead,
    curve_area,
    known_mean,
    load_router_model,
    save_router_model,
)
from conductor_trainer.routing_data import RoutingData, train_router

from fakes.api_process import announced_addresses, start_api_role
from fakes.cli import run_conductor
from fakes.embedder import HASH_DIM, HashEmbedder
from fakes.gateway_process import write_pool_file
from fakes.openai_server import FakeOpenAIServer
from fakes.scripted import ScriptedBackend, lists

DIM = HASH_DIM
NAMES = ["alpha", "beta", "gamma", "delta", "epsilon"]


def model(seed: int = 0) -> RouterModel:
    rng = np.random.default_rng(seed)
    features = len(QUESTION_FEATURES)
    return RouterModel(
        dim=DIM,
        features=list(QUESTION_FEATURES),
        feature_mean=rng.normal(size=features).tolist(),
        feature_scale=rng.uniform(0.5, 2, size=features).tolist(),
        workers=[
            WorkerHead(
                name=name,
                coef=rng.normal(size=DIM + features).tolist(),
                intercept=float(rng.normal()),
                cost_usd=float(rng.uniform(0.00005, 0.01)),
                trained_on=100,
            )
            for name in NAMES
        ],
    )


def table_model(head: HeadKind, seed: int = 0) -> RouterModel:
    """A knn router over 40 training questions (a fifth of their results unknown, and the last
    worker's known on 4 only) or a cluster router over 6 centroids; shares in thirds, so that
    workers often tie."""
    rng = np.random.default_rng(seed)
    rows = 40 if head == "knn" else 6
    points = rng.normal(size=(rows, DIM))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    right = rng.integers(0, 4, size=(rows, len(NAMES))) / 3
    if head == "knn":
        right[rng.random(right.shape) < 0.2] = np.nan
        right[4:, -1] = np.nan  # the last worker is known on 4 questions only
    return RouterModel(
        head=head,
        dim=DIM,
        points=PackedArray.of(points, "float16" if head == "knn" else "float32"),
        right=PackedArray.of(right, "float32"),
        neighbours=5 if head == "knn" else None,
        workers=[
            WorkerHead(name=name, cost_usd=float(rng.uniform(0.00005, 0.01)), trained_on=rows)
            for name in NAMES
        ],
    )


def mlp_model(seed: int = 0) -> RouterModel:
    """An mlp router without a domain head: two networks of 6 hidden units, seeded weights."""
    rng = np.random.default_rng(seed)
    features = len(QUESTION_FEATURES)

    def normal(*shape: int) -> Any:
        return rng.normal(size=shape).astype(np.float32)

    inputs, workers = DIM + features, len(NAMES)
    return RouterModel(
        head="mlp",
        dim=DIM,
        features=list(QUESTION_FEATURES),
        feature_mean=rng.normal(size=features).tolist(),
        feature_scale=rng.uniform(0.5, 2, size=features).tolist(),
        networks=[
            MlpNetwork.of(
                MlpWeights(normal(6, inputs), normal(6), normal(workers, 6), normal(workers))
            )
            for _ in range(2)
        ],
        workers=[
            WorkerHead(name=name, cost_usd=float(rng.uniform(0.00005, 0.01)), trained_on=100)
            for name in NAMES
        ],
    )


ROUTER = Router(model(), HashEmbedder())  # type: ignore[arg-type]
ROUTERS = {
    "logistic": ROUTER,
    "mlp": Router(mlp_model(), HashEmbedder()),  # type: ignore[arg-type]
    "knn": Router(table_model("knn"), HashEmbedder()),  # type: ignore[arg-type]
    "cluster": Router(table_model("cluster"), HashEmbedder()),  # type: ignore[arg-type]
}


@settings(max_examples=200, deadline=None)
@given(
    head=st.sampled_from(list(ROUTERS)),
    question=st.text(min_size=1, max_size=200),
    allowed=st.sets(st.sampled_from([*NAMES, "not-in-the-router"])),
    weight=st.floats(min_value=0, max_value=5),
)
def test_only_an_allowed_worker_is_ever_chosen(
    head: str, question: str, allowed: set[str], weight: float
) -> None:
    decision = ROUTERS[head].choose(question, allowed=allowed, cost_weight=weight)
    known = allowed & set(NAMES)
    if not known:
        assert decision is None  # nothing it may pick: the caller falls back
        return
    assert decision is not None
    assert decision.worker in known
    assert set(decision.scores) == known
    best = max(s.utility for s in decision.scores.values())
    assert decision.scores[decision.worker].utility == best
    tied = [n for n, s in decision.scores.items() if s.utility == best]
    assert decision.scores[decision.worker].cost_usd == min(
        decision.scores[n].cost_usd for n in tied
    )


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
        (b"[1, 2]", "format 'list', expected 'conductor-router/4'"),
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


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"features": ["log_chars", "favourite_colour"]}, "unknown text features"),
        ({"feature_scale": [1.0] * 3}, "feature_mean and feature_scale need 8 values"),
        ({"feature_scale": [0.0] * 8}, "feature_scale values must be > 0"),
        ({"features": [], "feature_mean": [], "feature_scale": []}, "8 embedding dimensions + 0"),
    ],
)
def test_text_features_that_disagree_with_the_heads_are_refused(
    tmp_path: Path, change: dict[str, object], problem: str
) -> None:
    path = tmp_path / "router.json"
    path.write_text(json.dumps({**model().model_dump(), **change}))
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        load_router_model(path)


def test_a_version_1_router_without_text_features_still_routes(tmp_path: Path) -> None:
    first = model().model_dump()
    first.update(format="conductor-router/1", features=[], feature_mean=[], feature_scale=[])
    for head in first["workers"]:
        head["coef"] = head["coef"][:DIM]
    path = tmp_path / "router.json"
    path.write_text(json.dumps({k: v for k, v in first.items() if not k.startswith("feature")}))

    old = Router(load_router_model(path), HashEmbedder())  # type: ignore[arg-type]

    decision = old.choose("What is 6 * 7?", cost_weight=0.0)
    assert decision is not None
    assert decision.worker in NAMES


def test_a_router_whose_shapes_disagree_is_refused(tmp_path: Path) -> None:
    data = json.loads(model().model_dump_json())
    data["workers"][1]["coef"] = data["workers"][1]["coef"][:-1]
    path = tmp_path / "router.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="heads of beta do not have 16 coefficients"):
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


def test_knn_and_cluster_routers_score_as_their_baselines_define() -> None:
    """knn: per worker the mean of the known shares of the 5 nearest points (the worker's mean
    over all points when none is known), found as scikit-learn finds them; cluster: the
    nearest centroid's shares."""
    from sklearn.neighbors import NearestNeighbors  # type: ignore[import-untyped]

    questions = HashEmbedder().embed([f"q{n}" for n in range(30)])
    knn = ROUTERS["knn"]
    assert knn.model.points is not None
    assert knn.model.right is not None
    points, right = knn.model.points.array(), knn.model.right.array().astype(np.float64)
    _, nearest = NearestNeighbors(n_neighbors=5).fit(points).kneighbors(questions)
    known = ~np.isnan(right)
    shares = np.where(known, right, 0.0)
    prior = np.nanmean(right, axis=0)
    expected = known_mean(shares[nearest], known[nearest], prior)
    np.testing.assert_allclose(knn.p_right(questions, []), expected, rtol=1e-6)
    assert (known[nearest].sum(axis=1) == 0).any()  # some worker falls back to its mean

    cluster = ROUTERS["cluster"]
    assert cluster.model.points is not None
    assert cluster.model.right is not None
    centroids = cluster.model.points.array()
    closest = ((questions[:, None, :] - centroids[None]) ** 2).sum(axis=2).argmin(axis=1)
    np.testing.assert_array_equal(
        cluster.p_right(questions, []), cluster.model.right.array()[closest]
    )


@pytest.mark.parametrize("head", ["knn", "cluster"])
def test_a_knn_or_cluster_router_saved_and_loaded_chooses_the_same(
    tmp_path: Path, head: str
) -> None:
    path = tmp_path / f"router.{head}.json"
    save_router_model(ROUTERS[head].model, path)
    saved = json.loads(path.read_text())
    assert (saved["head"], saved["format"]) == (head, "conductor-router/4")
    assert "coef" not in saved["workers"][0]  # no empty logistic fields
    loaded = Router.load(path, HashEmbedder())  # type: ignore[arg-type]
    for n in range(30):
        before = ROUTERS[head].choose(f"q{n}", cost_weight=0.05)
        after = loaded.choose(f"q{n}", cost_weight=0.05)
        assert before is not None
        assert after is not None
        assert (before.worker, before.scores) == (after.worker, after.scores)


def _broken(head: HeadKind, field: str, value: Any) -> dict[str, Any]:
    """A valid knn or cluster file's JSON with ``field`` replaced, updated or (None) removed."""
    data: dict[str, Any] = json.loads(table_model(head).model_dump_json(exclude_none=True))
    if value is None:
        del data[field]
    elif isinstance(value, dict):
        data[field] = {**data[field], **value}
    else:
        data[field] = value
    return data


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (_broken("knn", "points", {"data": "not base64!"}), "points: data is not base64"),
        (
            _broken("knn", "points", {"shape": [40, 9]}),
            "data holds 640 bytes, but a float16 array of shape [40, 9] takes 720",
        ),
        (
            _broken("knn", "points", PackedArray.of(np.zeros((40, 7)), "float16").model_dump()),
            "points have shape [40, 7]; a knn router needs (at least 1, 8)",
        ),
        (
            _broken(
                "knn", "points", PackedArray.of(np.full((40, 8), np.inf), "float16").model_dump()
            ),
            "points must be finite numbers",
        ),
        (
            _broken("knn", "right", PackedArray.of(np.zeros((39, 5)), "float32").model_dump()),
            "right has shape [39, 5], expected [40, 5]: one row per point, one column per worker",
        ),
        (
            _broken("knn", "right", PackedArray.of(np.full((40, 5), 1.5), "float32").model_dump()),
            "right shares must lie between 0 and 1",
        ),
        (_broken("knn", "neighbours", 41), "neighbours between 1 and its 40 points"),
        (_broken("knn", "neighbours", None), "neighbours between 1 and its 40 points"),
        (_broken("knn", "points", None), "a knn router needs its points and their right shares"),
        (_broken("knn", "features", ["log_chars"]), "a knn router reads no text features"),
        (
            _broken(
                "knn",
                "workers",
                [{"name": "alpha", "coef": [1.0], "cost_usd": 0.0, "trained_on": 1}],
            ),
            "a knn router has no coefficients; heads of alpha do",
        ),
        (
            _broken(
                "cluster", "right", PackedArray.of(np.full((6, 5), np.nan), "float32").model_dump()
            ),
            "a cluster router's right shares must all be known",
        ),
        (_broken("cluster", "neighbours", 3), "a cluster router has no neighbours"),
        (
            _broken("cluster", "head", "forest"),
            "head: Input should be 'logistic', 'mlp', 'knn' or 'cluster'",
        ),
        (
            {**model().model_dump(exclude_none=True), "neighbours": 5},
            "a logistic router keeps no points, right or neighbours",
        ),
    ],
)
def test_a_broken_knn_or_cluster_file_is_refused_with_the_reason(
    tmp_path: Path, data: dict[str, Any], problem: str
) -> None:
    path = tmp_path / "router.knn.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match=r"router file .*router\.knn\.json") as raised:
        load_router_model(path)
    assert problem in str(raised.value)


def _routing_data(count: int) -> RoutingData:
    """``count`` arithmetic questions and three workers: ``exact`` right on even numbers,
    ``rough`` on small ones, ``cheap`` rarely; the third of ``rough``'s results on odd items is
    unknown only where the item is for training (traces), so every held-out item is judged."""
    items = [
        EvalItem(
            suite="sums", id=str(n), question=f"What is {n} + {n % 7}?", answer="0", kind="math"
        )
        for n in range(count)
    ]
    rng = np.random.default_rng(0)
    right = np.array(
        [
            [float(n % 2 == 0), float(n < count // 2), float(rng.random() < 0.2)]
            for n in range(count)
        ]
    )
    held = np.array([is_held_out(item) for item in items])
    right[~held & (np.arange(count) % 3 == 0), 1] = np.nan
    cost = np.tile([0.004, 0.001, 0.0001], (count, 1)) * rng.uniform(0.9, 1.1, (count, 3))
    cost[np.isnan(right)] = np.nan
    return RoutingData(items, ["exact", "rough", "cheap"], right, cost)


def _judged_items(data: RoutingData) -> list[tuple[int, EvalItem]]:
    """The held-out items every worker ran: those the report judges routers on."""
    return [
        (i, item)
        for i, item in enumerate(data.items)
        if is_held_out(item) and not np.isnan(data.right[i]).any()
    ]


def _right_answers(
    router: Router, data: RoutingData, held: list[tuple[int, EvalItem]], weight: float
) -> float:
    """The right answers ``router`` gets on ``held``, choosing one question at a time."""
    right = 0.0
    for i, item in held:
        decision = router.choose(item.question, cost_weight=weight)
        assert decision is not None
        right += data.right[i, data.workers.index(decision.worker)]
    return right


@pytest.mark.parametrize(
    ("head", "router_head"),
    [("auto", "logistic"), pytest.param("mlp", "mlp", marks=pytest.mark.training)],
    ids=["auto (too few items to fold: logistic)", "mlp"],
)
def test_the_report_judges_each_baseline_through_the_router_file_that_serves_it(
    tmp_path: Path, head: HeadChoice, router_head: str
) -> None:
    """Trained, saved and loaded, each router (knn and cluster too; the router's head logistic
    or mlp) choosing one held-out question at a time, as serving and ``conductor eval`` do,
    gets exactly the right answers the report counted for it at every cost weight."""
    data = _routing_data(120)
    models, report = train_router(data, HashEmbedder(), head=head)  # type: ignore[arg-type]

    assert [c["name"] for c in report["curves"]] == ["router", "knn", "cluster"]
    assert report["head"] == {
        "chosen": router_head,
        "asked": head,
        "cv_folds": 0,
        "cv_measure": None,
        "cv": {},
    }
    held = _judged_items(data)
    assert len(held) == report["held_out_items"] > 10
    for curve in report["curves"]:
        path = tmp_path / f"{curve['name']}.json"
        save_router_model(models[curve["name"]], path)
        router = Router.load(path, HashEmbedder())  # type: ignore[arg-type]
        assert router.model.head == {"router": router_head}.get(curve["name"], curve["name"])
        for point in curve["points"]:
            right = _right_answers(router, data, held, point["cost_weight"])
            assert right == pytest.approx(point["correct"])
    knn = models["knn"]
    assert knn.points is not None
    assert knn.points.shape == (int((~data.held_out).sum()), DIM)
    assert knn.neighbours == 15


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
        "gsm8k,arc-easy,arc-challenge",
        "--limit",
        "50",
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
    assert (tmp_path / "router.report.png").stat().st_size > 10_000
    report = json.loads((tmp_path / "router.report.json").read_text())
    for curve in report["curves"]:
        low, high = curve["area_ci"]
        assert low <= curve["area"] <= high
    router = Router.load(router_file)
    assert router.model.cost_weight == 0.02
    assert set(router.names) == {"sim-frontier", "sim-math", "sim-coder", "sim-small"}

    from conductor_trainer.routing_data import routing_data

    data = routing_data([evaluated])
    held = _judged_items(data)
    assert len(held) == report["held_out_items"]
    curve = next(c for c in report["curves"] if c["name"] == "router")
    for point in curve["points"][::6]:
        right = _right_answers(router, data, held, point["cost_weight"])
        assert right == pytest.approx(point["correct"])
    refused = run_conductor("router", "train", str(tmp_path / "nothing"))
    assert refused.returncode == 2
    assert "no single-worker results" in refused.stderr


# -- serving: conductor-mini routed by the planner ---------------------------------------------

PLAN_POOL = [
    PoolEntry(name="gamma", description="g"),
    PoolEntry(name="unknown-to-the-router", description="u"),
    PoolEntry(name="alpha", description="a"),
    PoolEntry(name="conductor", description="", is_conductor=True),
]


def _plan_request(**fields: Any) -> PlanRequest:
    return PlanRequest(
        **{"question": "What is 17 * 23?", "pool": PLAN_POOL, "max_steps": 1, **fields}
    )


async def test_a_one_step_request_is_routed_and_its_scores_are_the_calls_output() -> None:
    backend = ScriptedBackend([lists([0], ["Solve it."], [[]])])
    planner = ConductorPlanner(backend, router=ROUTER)  # type: ignore[arg-type]

    outcome = await planner.plan(_plan_request())

    expected = ROUTER.choose(
        "What is 17 * 23?", allowed={"gamma", "alpha", "unknown-to-the-router"}
    )
    assert expected is not None
    assert backend.requests == []  # the language model was not asked
    assert (outcome.backend, outcome.valid, outcome.cost_usd) == ("router", True, 0.0)
    (step,) = outcome.plan.steps
    assert PLAN_POOL[step.model_id].name == expected.worker
    assert step.subtask == "What is 17 * 23?"
    record = json.loads(outcome.raw_output)
    assert record["worker"] == expected.worker
    assert set(record["scores"]) == {"gamma", "alpha"}  # the allowed workers it knows


async def test_the_requests_cost_weight_reaches_the_router_over_the_wire() -> None:
    from conductor_adapters.rpc.planner_wire import request_from_proto, request_to_proto

    cheapest = min(ROUTER.model.workers, key=lambda w: w.cost_usd).name
    planner = ConductorPlanner(ScriptedBackend(["unused"]), router=ROUTER)  # type: ignore[arg-type]
    pool = [PoolEntry(name=name, description=name) for name in NAMES]
    for request in (_plan_request(pool=pool, cost_weight=1000.0), _plan_request(pool=pool)):
        assert request_from_proto(request_to_proto(request)) == request  # distributed: gRPC
    outcome = await planner.plan(_plan_request(pool=pool, cost_weight=1000.0))
    assert pool[outcome.plan.steps[0].model_id].name == cheapest
    assert json.loads(outcome.raw_output)["cost_weight"] == 1000.0


async def test_the_planner_service_routes_over_grpc_as_distributed_mode_asks(
    tmp_path: Path,
) -> None:
    """``conductor planner`` with a router file: a one-step Plan over gRPC is the router's."""
    from conductor_adapters.rpc.planner_client import GrpcPlanner
    from conductor_adapters.settings import Settings

    from fakes.planner_service import factory_of, running_planner

    dim = 256  # WordLlama's, which the planner service loads
    heads = [
        WorkerHead(
            name=name,
            coef=[0.0] * dim,
            intercept=3.0 if name == "gamma" else -3.0,
            cost_usd=0.001,
            trained_on=10,
        )
        for name in NAMES
    ]
    path = tmp_path / "router.json"
    save_router_model(RouterModel(embedder=EMBEDDER_NAME, dim=dim, workers=heads), path)
    backend = ScriptedBackend(["unused"])
    settings_with_router = Settings(router_model=str(path))
    async with running_planner(factory_of(backend), settings=settings_with_router) as (server, _):
        await server.wait_loaded()
        client = GrpcPlanner(server.address)
        try:
            outcome = await client.plan(_plan_request())
        finally:
            await client.aclose()

    assert outcome.backend == "router"
    assert PLAN_POOL[outcome.plan.steps[0].model_id].name == "gamma"
    assert json.loads(outcome.raw_output)["scores"]["gamma"]["p_right"] > 0.9
    assert not backend.requests  # the language model was never asked


async def test_the_model_plans_what_the_router_cannot_decide_and_says_why() -> None:
    backend = ScriptedBackend([lists([0], ["Solve it."], [[]])])
    planner = ConductorPlanner(backend, router=ROUTER)  # type: ignore[arg-type]
    only_unknown = [PLAN_POOL[1], PLAN_POOL[3]]

    outcome = await planner.plan(_plan_request(pool=only_unknown))
    assert (
        outcome.backend
        == "scripted (the router knows none of the allowed workers: planned by the model)"
    )
    assert outcome.valid
    # Multi-step variants are never routed.
    multi = await planner.plan(_plan_request(max_steps=3))
    assert multi.backend == "scripted"
    assert len(backend.requests) == 2


def _router_for(names: list[str], favourite: str) -> RouterModel:
    """A router over ``names`` that is sure ``favourite`` is right and the others wrong, and
    whose favourite costs 100 times what the others do."""
    return RouterModel(
        dim=256,
        workers=[
            WorkerHead(
                name=name,
                coef=[0.0] * 256,
                intercept=4.0 if name == favourite else -4.0,
                cost_usd=0.01 if name == favourite else 0.0001,
                trained_on=10,
            )
            for name in names
        ],
    )


@pytest.mark.model
@pytest.mark.processes
def test_conductor_serve_answers_conductor_mini_with_the_routed_worker(tmp_path: Path) -> None:
    workers = FakeOpenAIServer(responder=lambda messages: "routed answer")
    planner = FakeOpenAIServer(responder=lambda messages: "not a plan")
    workers.start()
    planner.start()
    try:
        pool_file = write_pool_file(
            tmp_path / "pool.yaml",
            {
                name: {"provider": "openai-compatible", "model": name, "base_url": workers.base_url}
                for name in ("solver", "checker")
            },
        )
        save_router_model(_router_for(["solver", "checker"], "checker"), tmp_path / "router.json")
        env = {
            "CONDUCTOR_POOL_FILE": str(pool_file),
            "CONDUCTOR_PLANNER_BACKEND": "openai",
            "CONDUCTOR_PLANNER_BASE_URL": planner.base_url,
            "CONDUCTOR_PLANNER_MODEL": "fake-conductor",
            "CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'conductor.db'}",
            "CONDUCTOR_ROUTER_MODEL": str(tmp_path / "router.json"),
        }
        serve = start_api_role("serve", tmp_path / "serve.log", env)
        try:
            url, _ = announced_addresses(serve)
            client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
            for _ in range(2):
                reply = client.chat.completions.create(
                    model="conductor-mini", messages=[{"role": "user", "content": "What is 6 * 7?"}]
                )
            assert reply.choices[0].message.content == "routed answer"
            assert workers.chat_requests[-1].json["model"] == "checker"
            # A request that weighs cost heavily gets the cheap worker.
            client.chat.completions.create(
                model="conductor-mini",
                messages=[{"role": "user", "content": "What is 6 * 7?"}],
                extra_body={"conductor": {"cost_weight": 1.0}},
            )
            assert workers.chat_requests[-1].json["model"] == "solver"
            assert not planner.chat_requests  # the language-model Conductor was never asked
            workflow_id = (reply.model_extra or {})["conductor"]["workflow_id"]
            workflow = httpx.get(f"{url}/v1/workflows/{workflow_id}").json()
            call = workflow["planner_calls"][0]
            assert call["backend"] == "router"
            assert json.loads(call["raw_output"])["scores"]["checker"]["p_right"] > 0.95
        finally:
            serve.stop()
        # A bad router file stops the start with the reason.
        (tmp_path / "router.json").write_text("{}")
        refused = run_conductor("serve", "--port", "0", "--grpc-port", "-1", env=env, timeout=60)
        assert refused.returncode == 2
        assert "router.json: format None, expected 'conductor-router/4'" in refused.stderr
    finally:
        workers.stop()
        planner.stop()


def test_the_same_items_evaluated_twice_count_as_their_share_of_right_answers(
    tmp_path: Path,
) -> None:
    from conductor_evaluation import ItemResult
    from conductor_trainer.routing_data import routing_data

    items = tmp_path / "items.jsonl"
    items.write_text(
        "\n".join(
            json.dumps(
                {"id": str(n), "question": f"What is {n} + 1?", "answer": n + 1, "kind": "math"}
            )
            for n in range(3)
        )
    )
    runs = []
    for roll, outcomes in enumerate([(True, False, True), (False, False, True)]):
        run = tmp_path / f"eval-{roll}"
        run.mkdir()
        lines = [
            ItemResult(
                suite=str(items),
                item_id=str(n),
                strategy=f"single:{worker}",
                correct=right if worker == "a" else not right,
                status="completed",
                cost_usd=0.001 * (roll + 1),
            ).model_dump_json()
            for n, right in enumerate(outcomes)
            for worker in ("a", "b")
        ]
        (run / "results.jsonl").write_text("\n".join(lines) + "\n")
        runs.append(run)

    data = routing_data(runs)

    assert data.workers == ["a", "b"]
    assert [item.id for item in data.items] == ["0", "1", "2"]
    assert data.right[:, 0].tolist() == [0.5, 0.0, 1.0]
    assert data.right[:, 1].tolist() == [0.5, 1.0, 0.0]
    assert data.cost[:, 0].tolist() == pytest.approx([0.0015] * 3)
    with pytest.raises(ConfigurationError, match="no single-worker results"):
        routing_data([tmp_path / "empty"])


# -- the router as a strategy of conductor eval -------------------------------------------------

DOCUMENTED_ROUTER = Path(__file__).resolve().parents[2] / "docs/runs/router-sim/router.json"


def test_router_strategies_name_their_file_digest_and_refuse_a_bad_file(tmp_path: Path) -> None:
    from conductor.variants import BUILTIN_VARIANTS
    from conductor_evaluation.sim import builtin_sim_pool
    from conductor_evaluation.strategies import Kind, parse_strategies

    pool = builtin_sim_pool()
    plain, weighted = parse_strategies(
        f"router:{DOCUMENTED_ROUTER},router:{DOCUMENTED_ROUTER}:0.05", pool, BUILTIN_VARIANTS
    )
    assert plain.kind is weighted.kind is Kind.ROUTER
    assert plain.name.startswith("router:router.json@")
    assert (plain.cost_weight, weighted.cost_weight) == (None, 0.05)
    assert weighted.name == f"{plain.name}:0.05"
    for weight in ("-1", "nan"):
        with pytest.raises(ConfigurationError, match="the cost weight must be a number >= 0"):
            parse_strategies(f"router:{DOCUMENTED_ROUTER}:{weight}", pool, BUILTIN_VARIANTS)
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ConfigurationError, match=r"bad\.json: format 'list'"):
        parse_strategies(f"router:{tmp_path / 'bad.json'}", pool, BUILTIN_VARIANTS)
    save_router_model(_router_for(["nobody"], "nobody"), tmp_path / "other.json")
    with pytest.raises(ConfigurationError, match="knows none of the pool's workers"):
        parse_strategies(f"router:{tmp_path / 'other.json'}", pool, BUILTIN_VARIANTS)


@pytest.mark.model
@pytest.mark.processes
def test_conductor_eval_runs_a_trained_router_on_held_out_items(tmp_path: Path) -> None:
    done = run_conductor(
        "eval",
        "--pool",
        "sim",
        "--suite",
        "gsm8k,arc-challenge",
        "--limit",
        "10",
        "--held-out",
        "--strategies",
        f"router:{DOCUMENTED_ROUTER}:0.02,single:sim-frontier",
        "--out",
        str(tmp_path),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    suites = json.loads((tmp_path / "report.json").read_text())["suites"]
    routed = {suite: [r for r in rows if r["kind"] == "router"] for suite, rows in suites.items()}
    assert list(routed)[-1] == "all suites"  # the two suites, then pooled
    assert {suite: [(r["n"], r["failed"]) for r in rows] for suite, rows in routed.items()} == {
        "gsm8k": [(10, 0)],
        "arc-challenge": [(10, 0)],
        "all suites": [(20, 0)],
    }


NUMPY_BLOCKED = """
import sys
sys.modules["numpy"] = None  # as on a machine without the router extra: importing it fails
from conductor_cli.wiring import open_embedded_runtime  # what `conductor ask` and serve load
from conductor_evaluation.strategies import parse_strategies
from conductor_adapters.settings import Settings
from conductor_planner import load_router
from conductor.errors import ConfigurationError
assert load_router(Settings()) is None
try:
    load_router(Settings(router_model="router.json"))
except ConfigurationError as exc:
    print(exc)
"""


@pytest.mark.processes
def test_without_the_router_extra_everything_but_the_router_still_loads() -> None:
    """The README's first command installs no numpy: nothing else may import the router."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", NUMPY_BLOCKED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "CONDUCTOR_ROUTER_MODEL needs the router's packages (numpy is missing)" in done.stdout
    assert "pip install 'conductor[router]'" in done.stdout
