"""The replay provider: recorded answers of real LLMs, judged by their recorded scores.

Every table here is written by the test itself, small enough to check the report by hand.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from conductor.chat import ChatMessage
from conductor.errors import ConfigurationError, ProviderRejected
from conductor.pool import Pool, Price, Provider, WorkerSpec, parse_pool
from conductor_adapters.settings import Settings
from conductor_cli.wiring import open_eval_runtime
from conductor_evaluation.datasets import load_suite
from conductor_evaluation.harness import EvalOptions, EvalOutcome, evaluate, resolve_pool
from conductor_evaluation.items import AnswerKind, EvalItem
from conductor_evaluation.outcomes import worker_slug
from conductor_evaluation.replay import ReplayWorker, replay_pool
from conductor_evaluation.report import oracle_results, summarize
from conductor_evaluation.results import UNRECORDED, ItemResult
from conductor_evaluation.runner import EvalRuntime, run_one
from conductor_evaluation.sim import SimWorker, builtin_sim_pool, evaluating, simulating
from conductor_evaluation.split import is_held_out
from conductor_evaluation.strategies import parse_strategies
from conductor_evaluation.verify import verify
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.registry import build_workers

PROVIDERS = {Provider.REPLAY: ReplayWorker.from_spec, Provider.SIM: SimWorker.from_spec}
BIG, SMALL, MID = "org/Big-Model", "small", "Lab/mid-v1"


def outcome(score: float | None, cost: float | None = None, **more: Any) -> dict[str, Any]:
    return {"score": score, "cost_usd": cost, **more}


# Six questions: BIG right on most at 0.01 a question, SMALL cheap and weaker (not recorded on
# q5), MID between (recorded without a score on q6); scores 0.5 and 0.25 are shares of samples.
ROWS: list[dict[str, Any]] = [
    {
        "id": "q1",
        "question": "What is 2 + 2?",
        "domain": "gsm8k",
        "split": "test",
        "outcomes": {
            BIG: outcome(1, 0.01, response="4", prompt_tokens=10, completion_tokens=2),
            SMALL: outcome(1, 0.001, response="4", prompt_tokens=10, completion_tokens=3),
            MID: outcome(0, 0.003, response="5", prompt_tokens=10, completion_tokens=4),
        },
    },
    {
        "id": "q2",
        "question": "Capital of France?",
        "domain": "mmlu",
        "split": "train",
        "outcomes": {
            BIG: outcome(1, 0.01),
            SMALL: outcome(0, 0.001),
            MID: outcome(1, 0.003),
        },
    },
    {
        "id": "q3",
        "question": "Write add(a, b).",
        "domain": "mbpp",
        "split": None,
        "outcomes": {
            BIG: outcome(0, 0.01),
            SMALL: outcome(0, 0.001),
            MID: outcome(1, 0.003),
        },
    },
    {
        "id": "q4",
        "question": "Sort [3, 1, 2].",
        "domain": "mbpp",
        "split": "test",
        "outcomes": {
            BIG: outcome(0.5, 0.01),
            SMALL: outcome(0.25, 0.001),
            MID: outcome(0.5, 0.003),
        },
    },
    {
        "id": "q5",
        "question": "Largest planet?",
        "domain": "mmlu",
        "split": "test",
        "outcomes": {BIG: outcome(1, 0.01), MID: outcome(0, 0.003)},
    },
    {
        "id": "q6",
        "question": "What is 7 * 6?",
        "domain": "gsm8k",
        "split": "train",
        "outcomes": {
            BIG: outcome(1, 0.01),
            SMALL: outcome(1, 0.001),
            MID: outcome(None, 0.003),
        },
    },
]


def write_table(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return write_table(tmp_path / "table.jsonl", ROWS)


def items_of(table: Path, spec: str = "") -> dict[str, EvalItem]:
    return {i.id: i for i in load_suite(f"table:{table}{spec}")}


def replay_worker(table: Path, model: str, name: str = "w", **more: Any) -> WorkerSpec:
    return WorkerSpec(name=name, provider=Provider.REPLAY, model=model, table=str(table), **more)


def runtime_for(pool: Pool) -> EvalRuntime:
    gateway = WorkerGateway.in_process(pool, build_workers(pool, providers=PROVIDERS))
    return EvalRuntime(pool=pool, gateway=gateway)


async def run(item: EvalItem, spec: str, pool: Pool) -> ItemResult:
    runtime = runtime_for(pool)
    try:
        (strategy,) = [s for s in parse_strategies(spec, pool, {}) if s.runs]
        return await run_one(item, strategy, runtime, seed=0)
    finally:
        await runtime.aclose()


ASK = [ChatMessage(role="user", content="Question: What is 2 + 2?\n\nYour task: solve it")]


# -- the pool file ----------------------------------------------------------------------------


def test_a_replay_worker_needs_its_table_and_only_replay_workers_take_one(table: Path) -> None:
    with pytest.raises(ConfigurationError, match="provider 'replay' needs 'table'"):
        parse_pool({"workers": {"gpt": {"provider": "replay", "model": BIG}}})
    with pytest.raises(ConfigurationError, match="'table' belongs to provider 'replay'"):
        parse_pool({"workers": {"gpt": {"provider": "openai", "model": "x", "table": "t.jsonl"}}})
    pool = parse_pool(
        {"workers": {"gpt": {"provider": "replay", "model": BIG, "table": str(table)}}}
    )
    assert pool.get("gpt").replayed
    assert not pool.get("gpt").simulated
    assert [w.name for w in pool.available({})] == ["gpt"]  # no key to need

    with pytest.raises(ConfigurationError, match="'nobody' is not recorded in"):
        ReplayWorker.from_spec(replay_worker(table, "nobody"))
    with pytest.raises(ConfigurationError, match="replay provider"):
        build_workers(pool)  # a process started without it says so


# -- the worker's answers ---------------------------------------------------------------------


async def test_the_worker_answers_with_the_recorded_response_or_states_the_score(
    table: Path,
) -> None:
    items = items_of(table)
    big = ReplayWorker.from_spec(replay_worker(table, BIG))
    with evaluating(items["q1"]):
        answer = await big.complete(ASK, max_tokens=100, temperature=0)
    assert (answer.text, answer.cost_usd, answer.model) == ("4", 0.01, BIG)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (10, 2)

    with simulating(items["q4"]):  # the sim provider's name for the same context
        answer = await big.complete(ASK, max_tokens=100, temperature=0)
    assert answer.text == (
        "[replay] org/Big-Model recorded score 0.5 on this question; no response was recorded"
    )
    # No counts recorded: the prompt estimated as the simulator does, no response no tokens.
    assert answer.usage.prompt_tokens == len(ASK[0].content) // 4 + 1
    assert answer.usage.completion_tokens == 0


async def test_the_worker_answers_only_evaluated_items_of_its_table(
    table: Path, tmp_path: Path
) -> None:
    big = ReplayWorker.from_spec(replay_worker(table, BIG))
    with pytest.raises(ProviderRejected, match="only items of their table being evaluated"):
        await big.complete(ASK, max_tokens=100, temperature=0)  # nothing evaluated here
    other = EvalItem(suite="t", id="q1", question="2 + 2?", answer="4", kind=AnswerKind.MATH)
    with evaluating(other), pytest.raises(ProviderRejected, match="t/q1 is not one of its"):
        await big.complete(ASK, max_tokens=100, temperature=0)  # same id, not a table item
    copy = write_table(tmp_path / "copy.jsonl", ROWS)
    with evaluating(items_of(copy)["q1"]), pytest.raises(ProviderRejected, match="not one of"):
        await big.complete(ASK, max_tokens=100, temperature=0)  # another table's question


async def test_a_worker_without_a_recorded_score_refuses_and_the_item_is_left_out(
    table: Path,
) -> None:
    items = items_of(table)
    small = ReplayWorker.from_spec(replay_worker(table, SMALL))
    mid = ReplayWorker.from_spec(replay_worker(table, MID))
    with evaluating(items["q5"]), pytest.raises(ProviderRejected, match="not recorded"):
        await small.complete(ASK, max_tokens=100, temperature=0)  # missing from the row
    with evaluating(items["q6"]), pytest.raises(ProviderRejected, match="not recorded"):
        await mid.complete(ASK, max_tokens=100, temperature=0)  # a null score

    pool = replay_pool(table)
    result = await run(items["q5"], "single:small", pool)
    assert (result.status, result.correct) == (UNRECORDED, False)
    assert "not recorded on this question: small" in result.detail


async def test_other_judges_refuse_a_tables_questions(table: Path) -> None:
    item = items_of(table)["q1"]
    with pytest.raises(ValueError, match="recorded score"):
        await verify(item, "4")
    sim = SimWorker.from_spec(builtin_sim_pool().workers[0])
    with evaluating(item), pytest.raises(ProviderRejected, match="outcome table"):
        await sim.complete(ASK, max_tokens=100, temperature=0)


# -- cost, tokens, latency and judging through the workflow -----------------------------------


async def test_recorded_cost_and_tokens_reach_the_workflow(table: Path) -> None:
    items = items_of(table)
    pool = replay_pool(table)
    result = await run(items["q1"], "single:big-model", pool)
    assert result.status == "completed"
    assert (result.cost_usd, result.prompt_tokens, result.completion_tokens) == (0.01, 10, 2)
    assert (result.answer, result.score, result.correct) == ("4", 1.0, True)

    # Where no cost is recorded, the pool's price of the tokens applies; a stream keeps a
    # recorded one.
    rows = [{**ROWS[0], "outcomes": {BIG: outcome(1, None, prompt_tokens=1000)}}]
    unpriced = write_table(table.with_name("unpriced.jsonl"), rows)
    priced = Pool(workers=(replay_worker(unpriced, BIG, price=Price(input=2.0)),))
    result = await run(items_of(unpriced)["q1"], "single:w", priced)
    assert result.cost_usd == pytest.approx(0.002)
    streamed = Pool(workers=(replay_worker(table, BIG, stream=True),))
    assert (await run(items["q1"], "single:w", streamed)).cost_usd == 0.01


async def test_the_recorded_latency_is_waited(tmp_path: Path) -> None:
    rows = [{**ROWS[0], "outcomes": {BIG: outcome(1, 0.01, latency_s=0.2)}}]
    slow = write_table(tmp_path / "slow.jsonl", rows)
    started = time.perf_counter()
    result = await run(items_of(slow)["q1"], "single:big-model", replay_pool(slow))
    assert time.perf_counter() - started >= 0.2
    assert result.latency_ms >= 200


async def test_a_workflow_is_judged_by_its_final_workers_recorded_score(table: Path) -> None:
    items = items_of(table)
    pool = replay_pool(table)
    assert (await run(items["q4"], "single:small", pool)).score == 0.25

    # q3: only MID is right. Aggregating, MID's score decides whatever the proposers had.
    moa = await run(items["q3"], "moa:big-model+small>mid-v1", pool)
    assert moa.workers == ["big-model", "small", "mid-v1"]
    assert (moa.score, moa.correct) == (1.0, True)
    assert moa.cost_usd == pytest.approx(0.01 + 0.001 + 0.003)
    moa = await run(items["q3"], "moa:mid-v1+small>big-model", pool)
    assert (moa.score, moa.correct) == (0.0, False)
    # A step that sees a right answer gains nothing: reflecting keeps the worker's own score.
    assert (await run(items["q3"], "reflect:big-model:1", pool)).score == 0.0


# -- report, oracle, split, pool -------------------------------------------------------------


def result(item: str, strategy: str, score: float | None, cost: float, **more: Any) -> ItemResult:
    correct = more.pop("correct", score is not None and score >= 0.5)
    return ItemResult(
        suite="s",
        item_id=item,
        strategy=strategy,
        correct=correct,
        status=more.pop("status", "completed"),
        score=score,
        cost_usd=cost,
        **more,
    )


def test_fractional_scores_average_and_the_oracle_takes_the_best_then_the_cheapest() -> None:
    pool = Pool(
        workers=tuple(
            WorkerSpec(name=n, provider=Provider.REPLAY, model=n, table="t") for n in "abc"
        )
    )
    strategies = parse_strategies("oracle", pool, {})
    results = [
        result("1", "single:a", 0.5, 0.01),
        result("1", "single:b", 0.5, 0.002),  # as good as a, cheaper: the oracle's pick
        result("1", "single:c", 0.25, 0.0),
        result("2", "single:a", 1.0, 0.01),
        result("2", "single:b", 0.0, 0.002),
        result("2", "single:c", None, 0.0, status=UNRECORDED, correct=False),
    ]
    picks = {
        r.item_id: (r.score, r.cost_usd)
        for r in oracle_results(results, ["single:a", "single:b", "single:c"])
    }
    assert picks == {"1": (0.5, 0.002), "2": (1.0, 0.01)}

    rows = {r.strategy: r for r in summarize(results, strategies)["s"]}
    assert rows["single:a"].accuracy == pytest.approx(0.75)
    assert rows["single:a"].correct == 2  # both at 0.5 or more
    assert rows["single:c"].accuracy == pytest.approx(0.25)
    assert (rows["single:c"].n, rows["single:c"].unrecorded) == (1, 1)
    assert rows["oracle"].accuracy == pytest.approx(0.75)
    low, high = rows["single:a"].ci95
    assert low < 0.75 < high

    # Results written before scores existed still load: their score is their verdict.
    old = ItemResult.model_validate_json(
        '{"suite": "s", "item_id": "1", "strategy": "x", "correct": true, "status": "completed"}'
    )
    assert (old.score, old.value) == (None, 1.0)


def test_the_tables_test_split_is_held_out(table: Path) -> None:
    items = items_of(table)
    assert [is_held_out(items[i]) for i in ("q1", "q2", "q4", "q5", "q6")] == [
        True,
        False,
        True,
        True,
        False,
    ]
    # No split: the hash of the item key, as for any suite.
    plain = EvalItem(
        suite=items["q3"].suite, id="q3", question="x", answer="", kind=AnswerKind.EXACT
    )
    assert is_held_out(items["q3"]) == is_held_out(plain)
    meta = items["q4"].metadata
    assert meta == {"table": str(table.resolve()), "domain": "mbpp", "split": "test"}
    assert list(items_of(table, "#mbpp")) == ["q3", "q4"]
    with pytest.raises(ConfigurationError, match=r"no question of domain 'math'.*gsm8k, mmlu"):
        items_of(table, "#math")


def test_a_replay_pool_has_a_worker_per_recorded_worker(table: Path, tmp_path: Path) -> None:
    assert [worker_slug(n) for n in (BIG, "A b/C+D", "x/Y_1.5")] == ["big-model", "c-d", "y_1.5"]
    pool, label = resolve_pool(f"replay:{table}", Settings())
    assert [(w.name, w.model) for w in pool.workers] == [
        ("big-model", BIG),
        ("small", SMALL),
        ("mid-v1", MID),
    ]
    assert all(
        w.provider is Provider.REPLAY and w.table == str(table.resolve()) for w in pool.workers
    )
    assert label.startswith(f"replay:{table}")
    # Described by the questions outside the test split only (q2, q3, q6: nothing of the
    # questions a Conductor is judged on): BIG (1 + 0 + 1) / 3; MID has a score on two of them.
    assert pool.get("big-model").description == (
        "big-model: recorded score 0.67, $10 per 1k questions."
    )
    assert "recorded score 1.00," in pool.get("mid-v1").description
    # MoA's aggregator: no prices, so the highest mean recorded cost.
    (moa,) = parse_strategies("moa", pool, {})
    assert moa.name == "moa:big-model+small+mid-v1>big-model"

    clash = [{**ROWS[0], "outcomes": {"a/gpt-4": outcome(1), "b/GPT-4": outcome(0)}}]
    with pytest.raises(ConfigurationError, match=r"'a/gpt-4' and 'b/GPT-4' both make .*'gpt-4'"):
        replay_pool(write_table(tmp_path / "clash.jsonl", clash))
    bad = [{**ROWS[0], "outcomes": {"org/-odd": outcome(1)}}]
    with pytest.raises(ConfigurationError, match="'org/-odd' makes the pool name '-odd'"):
        replay_pool(write_table(tmp_path / "bad.jsonl", bad))


# -- conductor eval end to end ---------------------------------------------------------------


async def evaluate_table(options: EvalOptions, tmp_path: Path) -> EvalOutcome:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}")

    def open_runtime(pool: Pool, with_planner: bool, step_timeout_s: float) -> Any:
        return open_eval_runtime(
            settings, pool, with_planner=with_planner, step_timeout_s=step_timeout_s
        )

    return await evaluate(options, settings, open_runtime)


async def test_conductor_eval_over_a_table_matches_the_table(table: Path, tmp_path: Path) -> None:
    suite = f"table:{table}"
    options = EvalOptions(
        suites=[suite],
        limit=10,
        strategies="single:*,random,oracle,moa",
        pool=f"replay:{table}",
        out=tmp_path / "out",
    )
    outcome = await evaluate_table(options, tmp_path)
    report = json.loads(outcome.report_json.read_text())
    rows = {r["strategy"]: r for r in report["suites"][suite]}
    assert report["replay_workers"] == ["big-model", "small", "mid-v1"]
    assert report["simulated_workers"] == []

    def check(strategy: str, n: int, score: float, cost: float, unrecorded: int = 0) -> None:
        row = rows[strategy]
        assert (row["n"], row["unrecorded"]) == (n, unrecorded), strategy
        assert row["accuracy"] == pytest.approx(score / n), strategy
        assert row["cost_per_question_usd"] == pytest.approx(cost / n), strategy

    # By hand from ROWS, the questions where the worker's score is recorded:
    check("single:big-model", 6, 1 + 1 + 0 + 0.5 + 1 + 1, 6 * 0.01)
    check("single:small", 5, 1 + 0 + 0 + 0.25 + 1, 5 * 0.001, unrecorded=1)
    check("single:mid-v1", 5, 0 + 1 + 1 + 0.5 + 0, 5 * 0.003, unrecorded=1)
    # The best per question, the cheapest among equals: small on q1 and q6, mid on q2 (as
    # right as big, cheaper), q3 and q4 (0.5, as big), big on q5.
    check("oracle", 6, 1 + 1 + 1 + 0.5 + 1 + 1, 0.001 + 0.003 + 0.003 + 0.003 + 0.01 + 0.001)
    # MoA, big aggregating, runs where all three are recorded (q1-q4): big's score, at the
    # recorded cost of its four calls (big's twice).
    moa = "moa:big-model+small+mid-v1>big-model"
    check(moa, 4, 1 + 1 + 0 + 0.5, 4 * (0.01 + 0.001 + 0.003 + 0.01), unrecorded=2)
    assert rows[moa]["steps_per_question"] == 4
    # Random: the recorded score of whichever worker it drew, where recorded.
    drawn = [r for r in outcome.results if r.strategy == "random" and r.status != UNRECORDED]
    by_id = {row["id"]: row for row in ROWS}
    names = {"big-model": BIG, "small": SMALL, "mid-v1": MID}
    expected = [by_id[r.item_id]["outcomes"][names[r.workers[0]]]["score"] for r in drawn]
    assert rows["random"]["accuracy"] == pytest.approx(sum(expected) / len(expected))

    markdown = outcome.report_md.read_text()
    assert "**Replayed workers**: big-model, small, mid-v1" in markdown
    assert "lower bound" in markdown
    assert "| not recorded |" in markdown

    # --held-out: the table's test split (q1, q4, q5), q3 by its key.
    held = await evaluate_table(
        EvalOptions(
            suites=[suite],
            limit=10,
            strategies="single:big-model",
            pool=f"replay:{table}",
            out=tmp_path / "held",
            held_out=True,
        ),
        tmp_path,
    )
    items = items_of(table)
    expected_ids = {i for i in ("q1", "q3", "q4", "q5") if is_held_out(items[i])}
    assert {r.item_id for r in held.results} == expected_ids
