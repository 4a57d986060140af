"""conductor-mini's router learnt from outcome tables: a domain head that finds a planted
specialist (under a logistic and an mlp head), per-domain expected costs, the domain head in
the file and what it refuses, fractional scores from replay evaluations, and the report read at
budgets of the best single worker's cost.

Every table here is written by the test itself, seeded, so the router finds the same every run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from typer.testing import CliRunner

from conductor.errors import ConfigurationError
from conductor_evaluation import ItemResult, ResultStore
from conductor_router import (
    QUESTION_FEATURES,
    PackedArray,
    Router,
    RouterModel,
    WorkerHead,
    fit_routers,
    held_out_report,
    load_router_model,
    save_router_model,
)
from conductor_router.heads import HEAD_C, HEAD_C_GRID
from conductor_router.model import DomainHead
from conductor_trainer.routing_data import routing_data, table_routing_data, train_router

from fakes.embedder import HASH_DIM, HashEmbedder

DIM = HASH_DIM
FEATURES = len(QUESTION_FEATURES)
DOCUMENTED_ROUTER = Path(__file__).resolve().parents[2] / "docs/runs/router-sim/router.json"


def write_table(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# -- a table with a planted specialist per domain ------------------------------------------------

PEOPLE = ["Ada", "Bruno", "Chen", "Dana", "Eli", "Femi", "Gus", "Hana", "Ivan", "Jo"]
THINGS = ["apples", "marbles", "stickers", "pencils", "coins", "shells", "cards", "eggs"]
MATH = [
    "{p} buys {a} boxes of {t} with {b} in each box. How many {t} does {p} have?",
    "{p} had {a} {t} and gave {b} of them to a friend. How many {t} are left?",
    "A train travels at {a} km per hour for {b} hours. How many kilometres does it cover?",
    "What is {a} times {b}, minus {c}?",
    "A garden is {a} metres long and {b} metres wide. What is its area in square metres?",
    "{p} saves {a} dollars every week. How many dollars has {p} saved after {b} weeks?",
    "A shop sells {t} at {b} cents each. {p} pays for {a} of them. How many cents is that?",
    "{p} reads {b} pages a day. How many days does a book of {a} pages take, rounded up?",
]
COUNTRIES = [
    "France", "Peru", "Japan", "Kenya", "Norway", "Chile", "Egypt", "Canada", "Poland",
    "Vietnam", "Ghana", "Mexico", "Sweden", "Turkey", "Nepal", "Brazil", "Portugal", "Morocco",
    "Finland", "Argentina", "Thailand", "Ireland", "Greece", "Mongolia", "Iceland",
]  # fmt: skip
BY_COUNTRY = [
    "What is the capital of {x}?",
    "On which continent is {x}?",
    "Which language do most people in {x} speak?",
]
BOOKS = [
    "Moby-Dick", "War and Peace", "Pride and Prejudice", "Don Quixote", "Hamlet", "Ulysses",
    "The Odyssey", "Les Miserables", "Madame Bovary", "Jane Eyre", "Middlemarch", "Faust",
]  # fmt: skip
PAINTINGS = [
    "the Mona Lisa", "The Starry Night", "The Night Watch", "Guernica", "The Birth of Venus",
    "The Scream", "Girl with a Pearl Earring", "The Persistence of Memory",
]  # fmt: skip
CITIES = [
    "Cairo", "Vienna", "Baghdad", "London", "Paris", "Budapest", "Rome", "Prague", "Lisbon",
    "Warsaw", "Khartoum", "Dresden",
]  # fmt: skip
LANDMARKS = [
    "Machu Picchu", "Angkor Wat", "the Alhambra", "Petra", "the Acropolis", "Chichen Itza",
    "the Taj Mahal", "Stonehenge", "the Colosseum", "Uluru", "Hagia Sophia", "the Kremlin",
]  # fmt: skip
TRIVIA = (
    [t.format(x=c) for c in COUNTRIES for t in BY_COUNTRY]
    + [f"Who wrote {b}?" for b in BOOKS]
    + [f"Who painted {p}?" for p in PAINTINGS]
    + [f"Which river flows through {c}?" for c in CITIES]
    + [f"In which country is {landmark}?" for landmark in LANDMARKS]
    + [f"Which empire or people built {landmark}?" for landmark in LANDMARKS]
    + [f"Which sea or ocean does {c} border?" for c in COUNTRIES[:20]]
)

GENERALIST, MATHLETE, QUIZZER = "acme/Generalist", "numbers/Mathlete", "quiz/Quizzer"
SLUGS = {GENERALIST: "generalist", MATHLETE: "mathlete", QUIZZER: "quizzer"}
# Per worker and domain (math, trivia): the chance of a right answer and the mean cost.
RIGHT = {GENERALIST: (0.7, 0.7), MATHLETE: (0.95, 0.2), QUIZZER: (0.2, 0.95)}
COST = {GENERALIST: (0.010, 0.014), MATHLETE: (0.0010, 0.0006), QUIZZER: (0.0008, 0.0012)}


def math_questions(count: int, rng: np.random.Generator) -> list[str]:
    questions: dict[str, None] = {}
    while len(questions) < count:
        template = MATH[int(rng.integers(len(MATH)))]
        a, b, c = (int(n) for n in rng.integers(2, 99, size=3))
        person, thing = PEOPLE[int(rng.integers(len(PEOPLE)))], THINGS[int(rng.integers(8))]
        questions[template.format(p=person, t=thing, a=a, b=b, c=c)] = None
    return list(questions)


def specialist_rows(
    seed: int = 7, count: int = 150, domains: tuple[str, str] = ("math", "trivia")
) -> list[dict[str, Any]]:
    """``count`` arithmetic word problems and ``count`` trivia questions (fewer where the
    lists run out), a third of each in the test split, three workers recorded on each:
    the generalist right on 70% of both and dear, the mathlete right on 95% of math and 20% of
    trivia, the quizzer the reverse, both cheap. Costs vary by domain and question."""
    rng = np.random.default_rng(seed)
    trivia = [TRIVIA[i] for i in rng.permutation(len(TRIVIA))[:count]]
    rows = []
    for d, questions in enumerate([math_questions(count, rng), trivia]):
        for n, question in enumerate(questions):
            rows.append(
                {
                    "id": f"{'mt'[d]}{n}",
                    "question": question,
                    "domain": domains[d],
                    "split": "test" if rng.random() < 1 / 3 else "train",
                    "outcomes": {
                        worker: {
                            "score": float(rng.random() < RIGHT[worker][d]),
                            "cost_usd": round(COST[worker][d] * rng.uniform(0.8, 1.2), 7),
                        }
                        for worker in (GENERALIST, MATHLETE, QUIZZER)
                    },
                }
            )
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def test_the_router_trained_on_a_table_finds_each_domains_specialist(tmp_path: Path) -> None:
    """The issue's acceptance test: the generalist is right on 70% of everything, each
    specialist on 95% of its own domain; trained through ``conductor router train --table``,
    the router sends math to the mathlete and trivia to the quizzer, and beats every worker."""
    from conductor_cli import app

    rows = specialist_rows()
    table = write_table(tmp_path / "table.jsonl", rows)
    out = tmp_path / "router.json"

    done = CliRunner().invoke(app, ["router", "train", "--table", str(table), "--out", str(out)])

    assert done.exit_code == 0, done.output
    held = [row for row in rows if row["split"] == "test"]
    assert f"{len(held)} held out" in " ".join(done.output.split())  # unwrapped
    model = load_router_model(out)
    assert (model.format, model.head) == ("conductor-router/4", "logistic")
    assert model.domains is not None
    assert model.domains.names == ["math", "trivia"]
    assert {w.name for w in model.workers} == set(SLUGS.values())
    # Each worker's cost per domain: its mean over the training questions of the domain.
    for worker, slug in SLUGS.items():
        head = next(w for w in model.workers if w.name == slug)
        expected = [
            np.mean(
                [
                    r["outcomes"][worker]["cost_usd"]
                    for r in rows
                    if r["split"] == "train" and r["domain"] == domain
                ]
            )
            for domain in ("math", "trivia")
        ]
        assert head.domain_cost_usd == pytest.approx(expected, rel=1e-9)

    report = json.loads((tmp_path / "router.report.json").read_text())
    assert report["held_out_items"] == len(held)
    curve = next(c for c in report["curves"] if c["name"] == "router")
    accuracy_only = curve["points"][0]
    assert accuracy_only["cost_weight"] == 0.0
    singles = {worker: s["accuracy"] for worker, s in report["single"].items()}
    assert accuracy_only["accuracy"] > max(singles.values()) + 0.1, (accuracy_only, singles)
    at_best_cost = curve["budgets"][0]
    assert at_best_cost["share_of_best_single_cost"] == 1.0
    assert at_best_cost["best_single"] == "generalist"
    assert at_best_cost["minus_best_single_ci"][0] > 0  # ahead, beyond the noise

    # Served from the file, one question at a time: the specialist of each question's domain,
    # and the right answers the report counted at cost weight 0.
    router = Router.load(out)
    chosen: dict[str, list[str]] = {"math": [], "trivia": []}
    right = 0.0
    for row in held:
        decision = router.choose(row["question"], cost_weight=0.0)
        assert decision is not None
        chosen[row["domain"]].append(decision.worker)
        worker = next(w for w, slug in SLUGS.items() if slug == decision.worker)
        right += row["outcomes"][worker]["score"]
    assert chosen["math"].count("mathlete") >= 0.9 * len(chosen["math"]), chosen["math"]
    assert chosen["trivia"].count("quizzer") >= 0.9 * len(chosen["trivia"]), chosen["trivia"]
    assert right == pytest.approx(accuracy_only["correct"])


@pytest.mark.training
def test_an_mlp_router_trained_on_a_table_round_trips_through_its_file(tmp_path: Path) -> None:
    """``conductor router train --head mlp``: the file keeps three networks over the domain
    chances, the embedding and the text features; loaded and served one question at a time
    (numpy), it sends each domain to its specialist and gets the right answers the report
    counted at every cost weight."""
    from conductor_cli import app

    rows = specialist_rows(seed=11)
    table = write_table(tmp_path / "table.jsonl", rows)
    out = tmp_path / "router.json"

    done = CliRunner().invoke(
        app, ["router", "train", "--table", str(table), "--out", str(out), "--head", "mlp"]
    )

    assert done.exit_code == 0, done.output
    assert "router head: mlp, as asked (--head mlp)" in " ".join(done.output.split())
    saved = json.loads(out.read_text())
    assert (saved["format"], saved["head"], len(saved["networks"])) == (
        "conductor-router/4",
        "mlp",
        3,
    )
    assert set(saved["networks"][0]["hidden_weight"]) == {"dtype", "shape", "data"}  # packed
    model = load_router_model(out)
    assert model.domains is not None
    assert model.domains.names == ["math", "trivia"]
    report = json.loads((tmp_path / "router.report.json").read_text())
    assert report["head"]["chosen"] == "mlp"
    router = Router.load(out)
    held = [row for row in rows if row["split"] == "test"]
    curve = next(c for c in report["curves"] if c["name"] == "router")
    for point in curve["points"][::10]:
        chosen: dict[str, list[str]] = {"math": [], "trivia": []}
        right = 0.0
        for row in held:
            decision = router.choose(row["question"], cost_weight=point["cost_weight"])
            assert decision is not None
            chosen[row["domain"]].append(decision.worker)
            worker = next(w for w, slug in SLUGS.items() if slug == decision.worker)
            right += row["outcomes"][worker]["score"]
        assert right == pytest.approx(point["correct"]), point
        if point["cost_weight"] == 0:
            assert chosen["math"].count("mathlete") >= 0.9 * len(chosen["math"])
            assert chosen["trivia"].count("quizzer") >= 0.9 * len(chosen["trivia"])


# -- reading an outcome table -------------------------------------------------------------------


def outcome(score: float | None, cost: float | None) -> dict[str, Any]:
    return {"score": score, "cost_usd": cost}


ALPHA = "vendor/Alpha"  # slug "alpha": sorted by slug it comes before "beta", by name after
SMALL_TABLE: list[dict[str, Any]] = [
    {
        "id": "m1",
        "question": "What is 12 * 3?",
        "domain": "math",
        "split": "train",
        "outcomes": {"beta": outcome(0.25, 0.001), ALPHA: outcome(1, 0.01)},
    },
    {
        "id": "t1",
        "question": "What is the capital of Peru?",
        "domain": "trivia",
        "split": "test",
        "outcomes": {ALPHA: outcome(0.5, 0.012)},  # beta not recorded
    },
    {
        "id": "t2",
        "question": "Who wrote Hamlet?",
        "domain": "trivia",
        "split": "train",
        # alpha wrong (0, not unknown); beta recorded without a score: unknown
        "outcomes": {ALPHA: outcome(0, 0.011), "beta": outcome(None, 0.001)},
    },
    {
        "id": "m2",
        "question": "What is 7 + 8?",
        "domain": "math",
        "split": "test",
        "outcomes": {ALPHA: outcome(0.75, 0.0), "beta": outcome(1, 0.002)},
    },
]


def test_a_tables_workers_are_named_by_slug_and_unrecorded_results_stay_unknown(
    tmp_path: Path,
) -> None:
    table = write_table(tmp_path / "table.jsonl", SMALL_TABLE)

    data = table_routing_data(table)

    assert data.workers == ["alpha", "beta"]  # as `--pool replay:TABLE` names them
    assert [item.id for item in data.items] == ["m1", "t1", "t2", "m2"]
    np.testing.assert_array_equal(
        data.right, [[1.0, 0.25], [0.5, np.nan], [0.0, np.nan], [0.75, 1.0]]
    )
    np.testing.assert_array_equal(
        data.cost, [[0.01, 0.001], [0.012, np.nan], [0.011, np.nan], [0.0, 0.002]]
    )
    assert data.held_out.tolist() == [False, True, False, True]  # the table's own split
    assert data.domains == ["math", "trivia", "trivia", "math"]


def test_a_recorded_score_without_its_cost_or_two_workers_of_one_slug_are_refused(
    tmp_path: Path,
) -> None:
    unpriced = [
        *SMALL_TABLE,
        {**SMALL_TABLE[0], "id": "m3", "outcomes": {"beta": outcome(1, None)}},
    ]
    with pytest.raises(ConfigurationError, match="some recorded scores have no recorded cost"):
        table_routing_data(write_table(tmp_path / "unpriced.jsonl", unpriced))
    # A cost without a score is no result at all: nothing to refuse.
    costed = [{**SMALL_TABLE[0], "outcomes": {"beta": outcome(None, 0.001), ALPHA: outcome(1, 0)}}]
    assert np.isnan(table_routing_data(write_table(tmp_path / "c.jsonl", costed)).right[0, 1])
    clash = [{**SMALL_TABLE[0], "outcomes": {"a/Beta": outcome(1, 0.1), "beta": outcome(0, 0.1)}}]
    with pytest.raises(ConfigurationError, match="two recorded workers have the same slug"):
        table_routing_data(write_table(tmp_path / "clash.jsonl", clash))


@pytest.mark.parametrize(
    "domains",
    [("math", "math"), ("math", "trivia-in-test-only")],
    ids=["one domain", "a second domain held out only"],
)
def test_one_training_domain_gives_no_domain_head_and_the_router_still_serves(
    tmp_path: Path, domains: tuple[str, str]
) -> None:
    rows = specialist_rows(seed=3, count=40, domains=domains)
    for row in rows:  # the second domain's questions all held out
        if row["domain"] != "math":
            row["split"] = "test"
    data = table_routing_data(write_table(tmp_path / "table.jsonl", rows))

    models, report = train_router(data, HashEmbedder())  # type: ignore[arg-type]

    model = models["router"]
    assert (model.format, model.domains) == ("conductor-router/4", None)
    assert all(w.domain_cost_usd is None for w in model.workers)
    assert len(model.workers[0].coef or []) == DIM + FEATURES  # no domain inputs
    path = tmp_path / "router.json"
    save_router_model(model, path)
    assert "domains" not in json.loads(path.read_text())
    router = Router.load(path, HashEmbedder())  # type: ignore[arg-type]
    decision = router.choose(rows[0]["question"], cost_weight=0.0)
    assert decision is not None
    assert {name: s.cost_usd for name, s in decision.scores.items()} == {
        w.name: w.cost_usd for w in model.workers
    }
    assert report["held_out_items"] > 0
    assert [c["name"] for c in report["curves"]] == ["router", "knn", "cluster"]


def test_a_worker_never_run_on_a_domain_in_training_costs_its_mean_there(tmp_path: Path) -> None:
    rows = specialist_rows(seed=5, count=30)
    for row in rows:  # the quizzer is recorded on no training math question
        if row["domain"] == "math" and row["split"] == "train":
            del row["outcomes"][QUIZZER]
    data = table_routing_data(write_table(tmp_path / "table.jsonl", rows))

    models, _ = train_router(data, HashEmbedder())  # type: ignore[arg-type]

    quizzer = next(w for w in models["router"].workers if w.name == "quizzer")
    trivia = [
        r["outcomes"][QUIZZER]["cost_usd"]
        for r in rows
        if r["split"] == "train" and r["domain"] == "trivia"
    ]
    assert quizzer.cost_usd == pytest.approx(np.mean(trivia))
    assert quizzer.domain_cost_usd == pytest.approx([quizzer.cost_usd, np.mean(trivia)])


# -- format 3: the domain head in the file ------------------------------------------------------

DIGITS = DIM + QUESTION_FEATURES.index("log_digits")  # the column of the digits feature


def domain_model(
    *,
    mean_costs: tuple[float, float, float] = (0.011, 0.0025, 0.0025),
    specialist_coef: float = 0.3,
    specialist_intercept: float = -1.5,
) -> RouterModel:
    """A router whose domain head says "math" for a question with digits, "trivia" without
    (the embedding is not read): ``generalist`` right on 95% at about 0.01 a question,
    ``mathlete`` and ``quizzer`` reading their domain's chance (times the head's weight 10)
    and cheap in their own domain, dear in the other."""
    inputs = DIM + FEATURES
    math_row = [0.0] * inputs
    math_row[DIGITS] = 10.0

    def head(
        name: str, domain: int | None, intercept: float, costs: list[float], mean: float
    ) -> WorkerHead:
        coef = [0.0] * (2 + inputs)
        if domain is not None:
            coef[domain] = specialist_coef
        return WorkerHead(
            name=name,
            coef=coef,
            intercept=intercept,
            cost_usd=mean,
            domain_cost_usd=costs,
            trained_on=100,
        )

    return RouterModel(
        dim=DIM,
        features=list(QUESTION_FEATURES),
        feature_mean=[0.0] * FEATURES,
        feature_scale=[1.0] * FEATURES,
        domains=DomainHead(
            names=["math", "trivia"],
            coef=[math_row, [0.0] * inputs],
            intercept=[-5.0, 0.0],
            weight=10.0,
        ),
        workers=[
            head("generalist", None, 3.0, [0.010, 0.012], mean_costs[0]),
            head("mathlete", 0, specialist_intercept, [0.001, 0.004], mean_costs[1]),
            head("quizzer", 1, specialist_intercept, [0.004, 0.001], mean_costs[2]),
        ],
    )


def math_chance(question: str) -> float:
    """The hand-made domain head's chance that ``question`` is math."""
    digits = sum(c.isdigit() for c in question)
    logit = 10.0 * math.log1p(digits) - 5.0
    return 1.0 / (1.0 + math.exp(-logit))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def knn_model() -> RouterModel:
    rng = np.random.default_rng(0)
    return RouterModel(
        head="knn",
        dim=DIM,
        points=PackedArray.of(rng.normal(size=(4, DIM)), "float16"),
        right=PackedArray.of(rng.integers(0, 2, size=(4, 2)).astype(float), "float32"),
        neighbours=2,
        workers=[WorkerHead(name=n, cost_usd=0.001, trained_on=4) for n in ("a", "b")],
    )


def _changed(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``data`` with the field at dotted ``path`` (list indices as numbers) set to ``value``."""
    *parents, last = path.split(".")
    target: Any = data
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = value
    return data


def _domain_json() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(domain_model().model_dump_json(exclude_none=True))
    return data


DOMAIN_HEAD_COEF = [[0.0] * (DIM + FEATURES)] * 2


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (
            "domains.coef",
            [[0.0] * (DIM + FEATURES), [0.0] * (DIM + FEATURES - 1)],
            "the domain head needs 2 intercepts and 2 rows of 16 coefficients",
        ),
        ("domains.coef", DOMAIN_HEAD_COEF * 2, "the domain head needs 2 rows of coefficients"),
        ("domains.intercept", [0.0, 0.0, 0.0], "the domain head needs 2 intercepts"),
        ("domains.names", ["math", "math"], "domain names repeat: ['math', 'math']"),
        ("domains.names", ["math"], "domains.names: List should have at least 2 items"),
        ("domains.weight", 0.0, "domains.weight: Input should be greater than 0"),
        (
            "workers.1.coef",
            [0.0] * (DIM + FEATURES),
            "heads of mathlete do not have 18 coefficients (2 domains + 8 embedding dimensions "
            "+ 8 text features)",
        ),
        ("workers.2.domain_cost_usd", [0.001], "domain_cost_usd needs 2 costs >= 0"),
        ("workers.2.domain_cost_usd", [0.001, 0.0, 0.1], "domain_cost_usd needs 2 costs >= 0"),
        ("workers.0.domain_cost_usd", [0.01, -0.01], "domain_cost_usd needs 2 costs >= 0"),
        ("workers.0.domain_cost_usd", [math.nan, 0.01], "domain_cost_usd needs 2 costs >= 0"),
    ],
)
def test_a_domain_head_that_disagrees_with_the_file_is_refused_with_the_reason(
    tmp_path: Path, path: str, value: Any, problem: str
) -> None:
    file = tmp_path / "router.json"
    file.write_text(json.dumps(_changed(_domain_json(), path, value)))
    with pytest.raises(ConfigurationError, match=r"router file .*router\.json") as raised:
        load_router_model(file)
    assert problem in str(raised.value)


def test_domain_costs_without_a_domain_head_are_refused(tmp_path: Path) -> None:
    data = _domain_json()
    del data["domains"]
    for head in data["workers"]:
        head["coef"] = head["coef"][2:]
    file = tmp_path / "router.json"
    file.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match=re.escape("domain_cost_usd needs 0 costs")):
        load_router_model(file)
    for head in data["workers"]:
        del head["domain_cost_usd"]
    file.write_text(json.dumps(data))
    assert load_router_model(file).domains is None  # the same router, without: served


@pytest.mark.parametrize("head", ["knn", "cluster"])
def test_a_knn_or_cluster_file_with_a_domain_head_is_refused(tmp_path: Path, head: str) -> None:
    data: dict[str, Any] = json.loads(knn_model().model_dump_json(exclude_none=True))
    if head == "cluster":
        del data["neighbours"]
    data["head"] = head
    data["domains"] = _domain_json()["domains"]
    file = tmp_path / "router.json"
    file.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match=f"a {head} router reads no text features and no"):
        load_router_model(file)


def test_a_format_2_router_still_loads_and_routes() -> None:
    model = load_router_model(DOCUMENTED_ROUTER)
    assert (model.format, model.domains) == ("conductor-router/2", None)
    router = Router(model)

    decision = router.choose("What is 17 * 23?", cost_weight=0.0)

    assert decision is not None
    assert decision.worker in router.names
    assert {name: s.cost_usd for name, s in decision.scores.items()} == {
        w.name: w.cost_usd for w in model.workers
    }


# -- serving a domain-head router ---------------------------------------------------------------

MATH_QUESTION = "What is 37 * 41 + 12?"
TRIVIA_QUESTION = "Which river flows through Cairo?"


def test_a_questions_expected_cost_is_its_domain_chances_times_the_domain_costs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "router.json"
    save_router_model(domain_model(), path)
    router = Router.load(path, HashEmbedder())  # type: ignore[arg-type]
    costs = {w.name: w.domain_cost_usd for w in router.model.workers}

    for question in (MATH_QUESTION, TRIVIA_QUESTION):
        decision = router.choose(question, cost_weight=0.0)
        assert decision is not None
        chance = math_chance(question)
        for name, score in decision.scores.items():
            math_cost, trivia_cost = costs[name] or []
            assert score.cost_usd == pytest.approx(chance * math_cost + (1 - chance) * trivia_cost)
        # The specialists read their domain's chance times the head's weight, 10.
        assert decision.scores["mathlete"].p_right == pytest.approx(sigmoid(3 * chance - 1.5))
        assert decision.scores["quizzer"].p_right == pytest.approx(sigmoid(3 * (1 - chance) - 1.5))
        assert decision.worker == "generalist"  # accuracy only: the surest

    on_math = router.choose(MATH_QUESTION)
    on_trivia = router.choose(TRIVIA_QUESTION)
    assert on_math is not None
    assert on_trivia is not None
    assert on_math.scores["mathlete"].cost_usd == pytest.approx(0.001, rel=1e-3)
    assert on_trivia.scores["mathlete"].cost_usd == pytest.approx(0.004, rel=1e-2)
    recorded = on_math.as_record()["scores"]["mathlete"]  # what a trace keeps
    assert recorded["cost_usd"] == on_math.scores["mathlete"].cost_usd


@pytest.mark.parametrize(
    ("question", "cheaper"), [(MATH_QUESTION, "mathlete"), (TRIVIA_QUESTION, "quizzer")]
)
def test_weighing_cost_flips_the_choice_to_the_worker_cheaper_on_this_question(
    question: str, cheaper: str
) -> None:
    """The specialists cost the same on average: only the per-question expected cost tells
    which is cheaper here."""
    router = Router(domain_model(), HashEmbedder())  # type: ignore[arg-type]

    sure = router.choose(question, cost_weight=0.0)
    thrifty = router.choose(question, cost_weight=0.05)
    miserly = router.choose(question, cost_weight=100.0)

    assert sure is not None
    assert thrifty is not None
    assert miserly is not None
    assert sure.worker == "generalist"
    assert thrifty.worker == miserly.worker == cheaper
    assert miserly.scores[cheaper].cost_usd == min(s.cost_usd for s in miserly.scores.values())


def test_the_report_breaks_ties_as_serving_does_by_the_questions_expected_cost() -> None:
    """The two specialists are equally sure of every question (constant heads, as fitted on a
    worker always right in training); the mathlete is cheaper on average, but the quizzer is
    cheaper on trivia. Serving gives each tie to the worker cheaper on the question: the
    report must count what serving does."""
    model = domain_model(
        mean_costs=(0.011, 0.002, 0.003), specialist_coef=0.0, specialist_intercept=4.6
    )
    router = Router(model, HashEmbedder())  # type: ignore[arg-type]
    questions = [f"What is {n} * {n + 3}?" for n in range(5)]
    questions += ["Who wrote Hamlet?", "Who painted Guernica?", "Where is Petra?"]
    is_math = np.array([any(c.isdigit() for c in q) for q in questions])
    workers = ["generalist", "mathlete", "quizzer"]
    # Each specialist right on its domain only; the generalist wrong everywhere.
    right = np.stack([np.zeros(len(questions)), is_math, ~is_math], axis=1).astype(float)
    cost = np.array([[0.01, 0.001, 0.004] if m else [0.012, 0.004, 0.001] for m in is_math])

    served = []
    for question in questions:
        decision = router.choose(question, cost_weight=0.0)
        assert decision is not None
        served.append(decision.worker)
    report = held_out_report(
        questions,
        HashEmbedder().embed(questions),
        workers=workers,
        right=right,
        cost=cost,
        held=np.ones(len(questions), dtype=bool),
        routers={"router": router},
    )

    assert served == ["mathlete" if m else "quizzer" for m in is_math]
    assert report["curves"][0]["points"][0]["correct"] == len(questions)


# -- fractional scores from replay evaluations --------------------------------------------------


def test_routing_data_learns_recorded_scores_and_skips_unrecorded_results(tmp_path: Path) -> None:
    table = write_table(tmp_path / "table.jsonl", SMALL_TABLE)
    suite = f"table:{table}"

    def result(item: str, worker: str, score: float | None, cost: float, **more: Any) -> Any:
        return ItemResult(
            suite=suite,
            item_id=item,
            strategy=f"single:{worker}",
            correct=score is not None and score >= 0.5,
            status=more.pop("status", "completed"),
            score=score,
            cost_usd=cost,
            **more,
        )

    runs = {
        "first": [
            result("m1", "a", 0.25, 0.002),
            result("m1", "b", 1.0, 0.01),
            result("t1", "a", 0.75, 0.002),
            result("t1", "b", None, 0.0, status="unrecorded"),  # not a wrong answer
            result("t2", "a", None, 0.0, status="error"),  # the harness failed
            result("t2", "b", 0.5, 0.01),
            result("m2", "a", None, 0.0, status="unrecorded"),
            result("m2", "b", None, 0.0, status="unrecorded"),
        ],
        "second": [result("m1", "a", 0.75, 0.004)],  # the same item again: the mean
    }
    dirs = []
    for name, results in runs.items():
        store = ResultStore(tmp_path / name)
        store.open({"run": name}, fresh=True)
        for r in results:
            store.append(r)
        dirs.append(store.out)

    data = routing_data(dirs)

    assert data.workers == ["a", "b"]
    assert [item.id for item in data.items] == ["m1", "t1", "t2"]  # m2: nothing recorded
    np.testing.assert_array_equal(data.right, [[0.5, 1.0], [0.75, np.nan], [np.nan, 0.5]])
    np.testing.assert_allclose(data.cost, [[0.003, 0.01], [0.002, np.nan], [np.nan, 0.01]])
    assert data.domains == ["math", "trivia", "trivia"]  # the table's, not the suite's name


async def test_a_replay_evaluation_gives_the_tables_own_routing_data(tmp_path: Path) -> None:
    """``conductor eval --pool replay:TABLE --strategies 'single:*'`` on a table with
    fractional scores: routing_data reads back each recorded score and cost, and unknown where
    none is recorded, as table_routing_data reads the table itself."""
    from conductor_adapters.settings import Settings
    from conductor_cli.wiring import open_eval_runtime
    from conductor_evaluation.harness import EvalOptions, evaluate

    table = write_table(tmp_path / "table.jsonl", SMALL_TABLE)
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}")

    def open_runtime(pool: Any, with_planner: bool, step_timeout_s: float) -> Any:
        return open_eval_runtime(
            settings, pool, with_planner=with_planner, step_timeout_s=step_timeout_s
        )

    options = EvalOptions(
        suites=[f"table:{table}"],
        limit=10,
        strategies="single:*",
        pool=f"replay:{table}",
        out=tmp_path / "eval",
    )
    await evaluate(options, settings, open_runtime)

    evaluated = routing_data([tmp_path / "eval"])
    recorded = table_routing_data(table)

    assert evaluated.workers == recorded.workers == ["alpha", "beta"]
    assert [i.id for i in evaluated.items] == [i.id for i in recorded.items]
    np.testing.assert_array_equal(evaluated.right, recorded.right)
    np.testing.assert_array_equal(evaluated.cost, recorded.cost)


# -- the report at budgets ----------------------------------------------------------------------


class GroupEmbedder:
    """Questions about alpaca are [1, 0], all others [0, 1]."""

    name = "groups"
    dim = 2

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.array(
            [[1.0, 0.0] if "alpaca" in t else [0.0, 1.0] for t in texts], dtype=np.float32
        ).reshape(len(texts), 2)


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def group_router(chances: dict[str, tuple[float, float]], costs: dict[str, float]) -> Router:
    """A router that reads only a question's group: per worker its chance on each group."""
    model = RouterModel(
        embedder="groups",
        dim=2,
        workers=[
            WorkerHead(
                name=name,
                coef=[logit(a), logit(b)],
                intercept=0.0,
                cost_usd=costs[name],
                trained_on=10,
            )
            for name, (a, b) in chances.items()
        ],
    )
    return Router(model, GroupEmbedder())  # type: ignore[arg-type]


def test_each_budget_takes_the_most_accurate_point_within_it() -> None:
    """Ten held-out questions, five about alpacas. ``big`` (0.01 a question) is right on 7,
    ``mid`` (0.005) on the five alpaca questions, ``small`` (0.001) on three others. The
    router's sweep passes, cost falling: everything to big (accuracy 0.7, cost 0.01), then
    alpacas to big and the rest to small (0.5 at 0.0055), then alpacas to mid (0.8 at 0.003),
    then all to small (0.3 at 0.001). Within 60% of big's cost the most accurate is the
    cheaper 0.8, not the dearer 0.5."""
    questions = [f"alpaca question {n}" for n in range(5)] + [f"other {n}" for n in range(5)]
    workers = ["big", "mid", "small"]
    costs = {"big": 0.01, "mid": 0.005, "small": 0.001}
    right = np.array(
        [
            *([1, 1, 0], [1, 1, 0], [0, 1, 0], [0, 1, 0], [0, 1, 0]),  # alpacas: mid always right
            *([1, 0, 1], [1, 0, 1], [1, 0, 1], [1, 0, 0], [1, 0, 0]),
        ],
        dtype=float,
    )
    cost = np.tile([costs[w] for w in workers], (10, 1))
    routers = {
        "router": group_router({"big": (0.99, 0.9), "mid": (0.6, 0.3), "small": (0.1, 0.8)}, costs),
        # A router that knows big alone: at every cost weight, the best single worker.
        "big-only": group_router({"big": (0.5, 0.5)}, {"big": 0.01}),
    }

    report = held_out_report(
        questions,
        GroupEmbedder().embed(questions),
        workers=workers,
        right=right,
        cost=cost,
        held=np.ones(10, dtype=bool),
        routers=routers,
    )

    assert report["single"]["big"]["accuracy"] == pytest.approx(0.7)
    curve, big_only = report["curves"]
    seen = {(round(p["cost_usd"], 6), p["accuracy"]) for p in curve["points"]}
    assert seen == {(0.01, 0.7), (0.0055, 0.5), (0.003, 0.8), (0.001, 0.3)}
    budgets = {b["share_of_best_single_cost"]: b for b in curve["budgets"]}
    assert list(budgets) == [1.0, 0.6, 0.25]
    for share, (accuracy, cost_usd) in {
        1.0: (0.8, 0.003),
        0.6: (0.8, 0.003),
        0.25: (0.3, 0.001),
    }.items():
        budget = budgets[share]
        assert budget["best_single"] == "big"
        assert budget["point"]["accuracy"] == pytest.approx(accuracy)
        assert budget["point"]["cost_usd"] == pytest.approx(cost_usd)
        assert budget["cost_share"] == pytest.approx(cost_usd / 0.01)
        assert budget["minus_best_single"] == pytest.approx(accuracy - 0.7)
        # Within the budget, no point of the curve is more accurate.
        within = [p for p in curve["points"] if p["cost_usd"] <= share * 0.01]
        assert budget["point"]["accuracy"] == max(p["accuracy"] for p in within)
    # At 60%: per question the router's answer minus big's, alpacas [0, 0, 1, 1, 1] and the
    # others [0, 0, 0, -1, -1]: a mean of 0.1, its paired interval around it.
    low, high = budgets[0.6]["minus_best_single_ci"]
    assert low < 0.1 < high

    same = {b["share_of_best_single_cost"]: b for b in big_only["budgets"]}
    assert same[1.0]["point"]["cost_usd"] == pytest.approx(0.01)
    assert same[1.0]["minus_best_single"] == 0
    assert same[1.0]["minus_best_single_ci"] == [0.0, 0.0]
    assert same[0.6]["point"] is None  # nothing it can do for less
    assert same[0.25]["point"] is None


def test_a_best_single_worker_that_costs_nothing_leaves_the_cost_share_unsaid() -> None:
    """A table may record a cost of 0 (a local model): when the most accurate worker is free,
    every budget is 0 and a share of it is undefined, but the report is still made."""
    questions = [f"alpaca {n}" for n in range(3)] + [f"other {n}" for n in range(3)]
    right = np.array([[1, 0], [1, 0], [1, 1], [1, 1], [0, 1], [1, 0]], dtype=float)
    router = group_router({"free": (0.9, 0.9), "paid": (0.5, 0.5)}, {"free": 0.0, "paid": 0.001})

    report = held_out_report(
        questions,
        GroupEmbedder().embed(questions),
        workers=["free", "paid"],
        right=right,
        cost=np.tile([0.0, 0.001], (6, 1)),
        held=np.ones(6, dtype=bool),
        routers={"router": router},
    )

    for budget in report["curves"][0]["budgets"]:
        assert budget["best_single"] == "free"
        assert budget["point"]["cost_usd"] == 0.0  # the free worker, at every cost weight
        assert budget["cost_share"] is None
        assert budget["minus_best_single"] == 0


# -- the regularisation chosen by cross-validation ---------------------------------------------


@pytest.mark.parametrize(("training", "cross_validated"), [(600, True), (499, False)])
def test_the_heads_regularisation_is_cross_validated_from_500_training_items(
    training: int, cross_validated: bool
) -> None:
    # Given questions of two domains, a worker right on one and one right on the other
    rng = np.random.default_rng(3)
    n = training + 100
    domains = ["a" if i % 2 else "b" for i in range(n)]
    right = np.array(
        [
            [float(rng.random() < (0.9 if d == "a" else 0.2)), float(rng.random() < 0.6)]
            for d in domains
        ]
    )
    cost = np.full((n, 2), 0.001)
    train = np.arange(n) < training
    questions = [f"question {i} of {d}" for i, d in enumerate(domains)]
    embedder = HashEmbedder()
    # When the routers are fitted
    models = fit_routers(
        questions,
        embedder.embed(questions),
        workers=["alpha", "beta"],
        right=right,
        cost=cost,
        train=train,
        embedder=embedder,  # type: ignore[arg-type]
        domains=domains,
    )
    # Then the router's C is one of the grid, chosen by its cross-validated scores from 500
    # training items on, and the default below
    trained = models["router"].trained
    if cross_validated:
        scores = trained["head_c_cv"]
        assert set(scores) == {f"{c:g}" for c in HEAD_C_GRID}
        assert trained["head_c"] in HEAD_C_GRID
        assert scores[f"{trained['head_c']:g}"] == max(scores.values())
    else:
        assert (trained["head_c"], trained["head_c_cv"]) == (HEAD_C, {})


@pytest.mark.training
def test_without_torch_auto_fits_the_logistic_heads_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router extra leaves torch out (serving needs numpy only): where it is missing,
    ``--head auto`` keeps the logistic heads and the output says why."""
    import importlib.util

    from conductor_cli import app

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else find_spec(name, *a),
    )
    table = write_table(tmp_path / "table.jsonl", specialist_rows(seed=11))
    out = tmp_path / "router.json"

    done = CliRunner().invoke(app, ["router", "train", "--table", str(table), "--out", str(out)])

    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())
    assert "the mlp head is not tried: torch is not installed (`pip install torch`)" in said
    saved = json.loads(out.read_text())
    assert (saved["head"], saved["trained"]["head_choice"]) == ("logistic", "logistic")
