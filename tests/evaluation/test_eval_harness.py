"""The evaluation harness: strategies, report figures, ranking on the simulated pool, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conductor.errors import ConfigurationError
from conductor.pool import Pool
from conductor.variants import BUILTIN_VARIANTS
from conductor.workflow import ALL
from conductor_adapters.settings import Settings
from conductor_cli.wiring import open_eval_runtime
from conductor_evaluation import code_check
from conductor_evaluation.harness import EvalOptions, EvalOutcome, evaluate
from conductor_evaluation.report import (
    ALL_SUITES,
    percentile,
    render_markdown,
    routing,
    summarize,
    wilson,
)
from conductor_evaluation.results import RESULTS_FILE, ItemResult
from conductor_evaluation.sandbox import SandboxLimits
from conductor_evaluation.sim import builtin_sim_pool
from conductor_evaluation.strategies import AGGREGATE, REVIEW, FixedPlanner, parse_strategies

from fakes.cli import run_conductor

POOL = builtin_sim_pool()
NAMES = [w.name for w in POOL.workers]


def settings(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}")


async def run_eval(options: EvalOptions, settings: Settings) -> EvalOutcome:
    """``conductor eval`` as the command runs it: the runtime from the composition root."""

    def open_runtime(pool: Pool, with_planner: bool, step_timeout_s: float) -> Any:
        return open_eval_runtime(
            settings, pool, with_planner=with_planner, step_timeout_s=step_timeout_s
        )

    return await evaluate(options, settings, open_runtime)


def accuracy(outcome: EvalOutcome, suite: str) -> dict[str, float]:
    return {row["strategy"]: row["accuracy"] for row in outcome.summary["suites"][suite]}


# -- strategies -----------------------------------------------------------------------------


def test_strategies_parse_and_the_oracle_brings_every_single_worker() -> None:
    strategies = parse_strategies(
        "conductor-mini, reflect:sim-small, moa, oracle", POOL, dict(BUILTIN_VARIANTS)
    )
    names = [s.name for s in strategies]
    assert names[:4] == [
        "conductor-mini",
        "reflect:sim-small:2",
        "moa:sim-frontier+sim-math+sim-coder+sim-small>sim-frontier",
        "oracle",
    ]
    assert names[4:] == [f"single:{n}" for n in NAMES]
    assert [s.name for s in parse_strategies("single:*", POOL, {})] == [
        f"single:{n}" for n in NAMES
    ]
    assert parse_strategies("moa:sim-math+sim-coder>sim-small", POOL, {})[0].workers == (
        "sim-math",
        "sim-coder",
        "sim-small",
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("single:nobody", "no worker 'nobody'"),
        ("reflect:sim-math:9", "review rounds are 1..4"),
        ("reflect:sim-math:x", "not a number"),
        ("moa:sim-math", "moa:A\\+B\\+C>AGGREGATOR"),
        ("best-of-n", "unknown strategy 'best-of-n'"),
        (" , ", "no strategy given"),
    ],
)
def test_bad_strategies_are_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_strategies(spec, POOL, dict(BUILTIN_VARIANTS))


def test_baseline_plans() -> None:
    def plan(spec: str, question: str = "What is 2+2?"):  # type: ignore[no-untyped-def]
        return FixedPlanner(parse_strategies(spec, POOL, {}, seed=1)[0]).plan_for(question, NAMES)

    single = plan("single:sim-coder")
    assert [s.model_id for s in single.steps] == [NAMES.index("sim-coder")]
    reflect = plan("reflect:sim-math:3")
    assert len(reflect.steps) == 4
    assert all(s.subtask == REVIEW and s.access_list == (ALL,) for s in reflect.steps[1:])
    moa = plan("moa")
    assert [s.access_list for s in moa.steps] == [(), (), (), (), (ALL,)]
    assert moa.steps[-1].subtask == AGGREGATE
    # Only the first step of a round sees the question, so the other proposers carry it.
    assert all("What is 2+2?" in s.subtask for s in moa.steps[1:4])
    routed = {plan("random", f"question {i}").steps[0].model_id for i in range(40)}
    assert routed == set(range(len(NAMES)))
    assert plan("random", "q").steps == plan("random", "q").steps  # seeded per question


def test_report_statistics() -> None:
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)
    assert wilson(0, 0) == (0.0, 0.0)
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([5.0], 0.95) == 5.0


def test_the_routing_table_says_which_workers_each_strategy_used() -> None:
    def run(strategy: str, item: str, workers: list[str], sees: list[list[int]]) -> ItemResult:
        return ItemResult(
            suite="gsm8k",
            item_id=item,
            strategy=strategy,
            correct=True,
            status="completed",
            steps=len(workers),
            workers=workers,
            sees=sees,
        )

    results = [
        run("conductor-mini", "1", ["sim-math"], [[]]),
        run("conductor-mini", "2", ["sim-math", "sim-frontier"], [[], [0]]),
        run("conductor-mini", "3", ["sim-small", "sim-small"], [[], []]),
        run("conductor-mini", "4", ["sim-frontier"], [[]]),
        run("single:sim-small", "1", ["sim-small"], [[]]),
    ]
    strategies = parse_strategies(
        "conductor-mini,single:sim-small,oracle", POOL, dict(BUILTIN_VARIANTS)
    )
    summary = summarize(results, strategies)

    table = routing(results, summary, NAMES)["gsm8k"]

    assert [r.strategy for r in table] == ["conductor-mini", "single:sim-small"]  # no oracle row
    conductor = table[0]
    assert conductor.n == 4
    assert conductor.worker_share == {
        "sim-frontier": 0.5,
        "sim-math": 0.5,
        "sim-coder": 0.0,
        "sim-small": 0.25,
    }
    assert conductor.plans_by_steps == {1: 2, 2: 2}
    assert conductor.sees_earlier_share == 0.25  # only item 2's second step saw the first
    assert table[1].worker_share["sim-small"] == 1.0
    markdown = render_markdown(
        summary,
        {
            "pool_label": "sim",
            "workers": NAMES,
            "planner": "p",
            "limit": 4,
            "seed": 0,
            "generated_at": "now",
            "command": "conductor eval",
        },
        None,
        routing(results, summary, NAMES),
    )
    assert "| conductor-mini | 50% | 50% | 0% | 25% | 1: 2, 2: 2 | 25% |" in markdown


def test_several_suites_are_also_judged_pooled_with_the_oracle_taken_per_suite() -> None:
    def run(suite: str, item: str, strategy: str, correct: bool, cost: float) -> ItemResult:
        return ItemResult(
            suite=suite,
            item_id=item,  # the same ids in both suites: the pool must not mix them up
            strategy=strategy,
            correct=correct,
            status="completed",
            steps=1,
            cost_usd=cost,
            workers=[strategy.removeprefix("single:")],
            sees=[[]],
        )

    results = [
        run("gsm8k", "1", "single:sim-math", True, 1.0),
        run("gsm8k", "1", "single:sim-small", False, 0.1),
        run("gsm8k", "2", "single:sim-math", False, 1.0),
        run("gsm8k", "2", "single:sim-small", False, 0.1),
        run("mbpp", "1", "single:sim-math", False, 1.0),
        run("mbpp", "1", "single:sim-small", True, 0.1),
    ]
    ran = {r.strategy for r in results}
    strategies = [  # the oracle brings every single worker; keep the two that ran
        s
        for s in parse_strategies("oracle", POOL, dict(BUILTIN_VARIANTS))
        if s.name in ran or s.name == "oracle"
    ]

    summary = summarize(results, strategies)

    assert list(summary)[-1] == ALL_SUITES
    pooled = {row.strategy: row for row in summary[ALL_SUITES]}
    assert (pooled["single:sim-math"].n, pooled["single:sim-math"].correct) == (3, 1)
    assert pooled["single:sim-math"].cost_per_question_usd == pytest.approx(1.0)
    # The oracle per suite: gsm8k 1 (sim-math, 1.0), gsm8k 2 (none right: the cheapest, 0.1),
    # mbpp 1 (sim-small, 0.1); across suites item "1" is two items, not one.
    assert (pooled["oracle"].n, pooled["oracle"].correct) == (3, 2)
    assert pooled["oracle"].cost_per_question_usd == pytest.approx(1.2 / 3)
    assert routing(results, summary, NAMES)[ALL_SUITES][0].n == 3
    assert ALL_SUITES not in summarize(results[:4], strategies)  # one suite: nothing pooled


def test_the_report_gives_the_methods_mean_reward() -> None:
    """0 for an invalid Conductor plan even when its fallback step was right, 0.5 wrong, 1
    right; baselines' plans count as valid."""

    def result(strategy: str, correct: bool, valid: bool | None) -> ItemResult:
        return ItemResult(
            suite="s", item_id=f"{strategy}{correct}{valid}", strategy=strategy,
            correct=correct, status="completed", plan_valid=valid,
        )  # fmt: skip

    rows = [
        result("conductor-mini", True, False),
        result("conductor-mini", False, True),
        result("conductor-mini", True, True),
        result("single:sim-small", False, None),
    ]
    strategies = parse_strategies("conductor-mini,single:sim-small", POOL, BUILTIN_VARIANTS)
    by_name = {r.strategy: r for r in summarize(rows, strategies)["s"]}
    assert by_name["conductor-mini"].mean_reward == pytest.approx((0 + 0.5 + 1) / 3)
    assert by_name["conductor-mini"].accuracy == pytest.approx(2 / 3)
    assert by_name["single:sim-small"].mean_reward == 0.5


# -- runs on the simulated pool -------------------------------------------------------------


@pytest.mark.slow  # hundreds of simulated workflows
async def test_the_sim_ranking_follows_the_profiles_and_the_report_is_written(
    tmp_path: Path,
) -> None:
    options = EvalOptions(
        suites=["gsm8k", "arc-easy"],
        limit=60,
        strategies="single:*,reflect:sim-small:2,moa,random,oracle",
        pool="sim",
        out=tmp_path / "out",
        concurrency=8,
    )
    outcome = await run_eval(options, settings(tmp_path))
    math, knowledge = accuracy(outcome, "gsm8k"), accuracy(outcome, "arc-easy")
    for suite in (math, knowledge):
        assert max(suite, key=lambda name: suite[name]) == "oracle"
        assert suite["oracle"] >= max(v for k, v in suite.items() if k != "oracle")
    # sim-math 0.9 > sim-coder 0.5 > sim-small 0.3 on math; sim-frontier 0.85 > sim-math 0.45
    # on knowledge; checking its own answer lifts the weak worker (check gain 0.5).
    assert math["single:sim-math"] > math["single:sim-coder"] > math["single:sim-small"]
    assert knowledge["single:sim-frontier"] > knowledge["single:sim-math"]
    assert math["reflect:sim-small:2"] > math["single:sim-small"]
    rows = outcome.summary["suites"]["gsm8k"]
    assert all(row["n"] == 60 for row in rows)
    frontier = next(r for r in rows if r["strategy"] == "single:sim-frontier")
    small = next(r for r in rows if r["strategy"] == "single:sim-small")
    assert frontier["cost_per_question_usd"] > 10 * small["cost_per_question_usd"] > 0
    assert next(r for r in rows if r["strategy"].startswith("moa"))["steps_per_question"] == 5
    routed = {r["strategy"]: r for r in outcome.summary["routing"]["gsm8k"]}
    assert routed["single:sim-math"]["worker_share"]["sim-math"] == 1.0
    moa = next(r for name, r in routed.items() if name.startswith("moa"))
    assert moa["plans_by_steps"] == {"5": 60}  # (JSON keys)
    assert moa["sees_earlier_share"] == 1.0  # the aggregator sees the proposals
    assert routed["single:sim-math"]["sees_earlier_share"] == 0.0
    markdown = outcome.report_md.read_text()
    assert "Simulated workers" in markdown
    assert "| oracle |" in markdown
    assert json.loads(outcome.report_json.read_text())["simulated_workers"] == NAMES
    assert outcome.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_a_rerun_resumes_from_the_cached_results(tmp_path: Path) -> None:
    options = EvalOptions(
        suites=["rg:chain_sum"],
        limit=6,
        strategies="single:*,oracle",
        pool="sim",
        out=tmp_path / "out",
    )
    first = await run_eval(options, settings(tmp_path))
    assert first.ran == 6 * len(NAMES)
    again = await run_eval(options, settings(tmp_path))
    assert again.ran == 0
    assert again.summary["suites"] == first.summary["suites"]
    # A line cut by a crash is dropped and its item runs again.
    results = tmp_path / "out" / RESULTS_FILE
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join(lines[:-1]) + lines[-1][:40])
    assert (await run_eval(options, settings(tmp_path))).ran == 1
    with pytest.raises(ConfigurationError, match="seed differ"):
        await run_eval(EvalOptions(**{**vars(options), "seed": 7}), settings(tmp_path))
    assert (
        await run_eval(
            EvalOptions(**{**vars(options), "seed": 7, "fresh": True}), settings(tmp_path)
        )
    ).ran == 6 * len(NAMES)


@pytest.mark.processes
async def test_hostile_code_is_contained_and_the_run_carries_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A perfect simulated coder hands back each item's reference: a loop, a bomb, a network
    call, and a good solution. The bad ones are stopped and judged wrong; the good one passes."""
    # A 2 s wall clock rather than the default 10 s: the loop is stopped the same way, sooner.
    monkeypatch.setattr(code_check, "DEFAULT_LIMITS", SandboxLimits(timeout_s=2.0))
    cases = {
        "loop": "def f():\n    while True:\n        pass\n\nf()\n",
        "bomb": "def f():\n    return bytearray(8 * 1024**3)\n\nf()\n",
        "net": "import socket\nsocket.create_connection(('127.0.0.1', 6379), 1)\n"
        "def f():\n    return 1\n",
        "good": "def f():\n    return 1\n",
    }
    suite = tmp_path / "code.jsonl"
    suite.write_text(
        "".join(
            json.dumps(
                {
                    "id": name,
                    "question": "Write f() returning 1.",
                    "answer": code,
                    "reference": code,
                    "kind": "code",
                    "domain": "code",
                    "tests": "assert f() == 1",
                    "entry_point": "f",
                }
            )
            + "\n"
            for name, code in cases.items()
        )
    )
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(
        "workers:\n  perfect:\n    provider: sim\n    model: sim/perfect\n"
        "    sim: {default: 1.0, latency_s: 0}\n"
    )
    options = EvalOptions(
        suites=[str(suite)],
        limit=10,
        strategies="single:perfect",
        pool=str(pool_file),
        out=tmp_path / "out",
    )
    outcome = await run_eval(options, settings(tmp_path))
    verdicts = {r.item_id: r for r in outcome.results}
    assert {k: v.correct for k, v in verdicts.items()} == {
        "loop": False,
        "bomb": False,
        "net": False,
        "good": True,
    }
    assert "timeout" in verdicts["loop"].detail
    assert "memory" in verdicts["bomb"].detail.lower()


@pytest.mark.processes
def test_conductor_eval_command_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_conductor(
        "eval",
        "--pool",
        "sim",
        "--suite",
        "rg:chain_sum",
        "--limit",
        "4",
        "--strategies",
        "single:*,oracle",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert f"report: {out / 'report.md'}" in done.stdout
    assert {p.name for p in out.iterdir()} >= {
        "report.md",
        "report.json",
        "accuracy_vs_cost.png",
        "results.jsonl",
        "run.json",
    }
    refused = run_conductor(
        "eval", "--pool", "sim", "--strategies", "single:gpt-9", "--out", str(out), timeout=60
    )
    assert refused.returncode == 2
    assert "no worker 'gpt-9' in the pool" in refused.stderr


@pytest.mark.model
async def test_the_conductor_is_evaluated_on_the_sim_pool(tmp_path: Path) -> None:
    options = EvalOptions(
        suites=["gsm8k"],
        limit=2,
        strategies="conductor-mini,oracle",
        pool="sim",
        out=tmp_path / "out",
    )
    outcome = await run_eval(options, settings(tmp_path))
    conductor = [r for r in outcome.results if r.strategy == "conductor-mini"]
    assert len(conductor) == 2
    assert all(
        r.plan_valid is not None and r.steps == 1 and r.workers[0] in NAMES for r in conductor
    )
    row = next(r for r in outcome.summary["suites"]["gsm8k"] if r["strategy"] == "conductor-mini")
    assert row["plan_valid_rate"] is not None
    assert outcome.summary["planner"].startswith("llamacpp")


async def test_held_out_evaluation_scores_only_items_training_never_sees(tmp_path: Path) -> None:
    from conductor_evaluation.datasets import load_suite
    from conductor_evaluation.split import is_held_out, split_items

    options = EvalOptions(
        suites=["gsm8k"],
        limit=8,
        strategies="single:sim-small",
        pool="sim",
        out=tmp_path / "out",
        held_out=True,
    )
    outcome = await run_eval(options, settings(tmp_path))
    items = {i.id: i for i in load_suite("gsm8k")}
    assert len(outcome.results) == 8
    assert all(is_held_out(items[r.item_id]) for r in outcome.results)
    trained, _ = split_items(["gsm8k"], limit=None, seed=3)
    assert not {r.item_id for r in outcome.results} & {i.id for i in trained}
    assert "held-out share" in outcome.report_md.read_text()


async def test_a_knn_router_file_runs_as_a_strategy(tmp_path: Path) -> None:
    """``router:FILE`` runs the knn baseline's file as it runs the router's: each question goes
    to the worker that was right on its nearest training question."""
    from conductor_router import (
        PackedArray,
        QuestionEmbedder,
        RouterModel,
        WorkerHead,
        save_router_model,
    )

    taught = {
        "Tom has 3 apples and buys 5 bags of 4 apples. How many apples does he have?": "sim-math",
        "Which planet is the closest to the sun?": "sim-frontier",
    }
    right = [[float(worker == best) for worker in NAMES] for best in taught.values()]
    knn = RouterModel(
        head="knn",
        dim=256,
        points=PackedArray.of(QuestionEmbedder().embed(list(taught)), "float16"),
        right=PackedArray.of(right, "float32"),
        neighbours=1,
        workers=[WorkerHead(name=name, cost_usd=0.001, trained_on=2) for name in NAMES],
    )
    path = tmp_path / "router.knn.json"
    save_router_model(knn, path)
    (strategy,) = parse_strategies(f"router:{path}", POOL, {})
    planner = FixedPlanner(strategy)
    astronomy = planner.plan_for("Which planet has the most moons?", NAMES)
    assert astronomy.steps[0].model_id == NAMES.index("sim-frontier")

    options = EvalOptions(
        suites=["gsm8k"],
        limit=3,
        strategies=f"router:{path}",
        pool="sim",
        out=tmp_path / "out",
    )
    outcome = await run_eval(options, settings(tmp_path))

    assert len(outcome.results) == 3
    assert {r.strategy for r in outcome.results} == {strategy.name}
    assert strategy.name.startswith("router:router.knn.json@")
    assert all(r.status == "completed" and r.workers == ["sim-math"] for r in outcome.results)


@pytest.mark.processes
def test_compare_evals_puts_checkpoints_side_by_side(tmp_path: Path) -> None:
    """scripts/compare_evals.py: one row per run for the Conductor strategy, per suite."""
    import subprocess
    import sys

    def report(directory: Path, planner: str, accuracy: float, reward: float) -> None:
        directory.mkdir()
        row = {
            "strategy": "conductor-grpo", "kind": "conductor", "n": 10, "correct": 5,
            "accuracy": accuracy, "ci95": [0.2, 0.8], "tokens_per_question": 1234.0,
            "cost_per_question_usd": 0.0, "steps_per_question": 1.5, "latency_p50_s": 1.0,
            "latency_p95_s": 2.0, "failed": 0, "plan_valid_rate": 0.9, "mean_reward": reward,
        }  # fmt: skip
        single = {**row, "strategy": "single:sim-small", "kind": "single", "accuracy": 0.1}
        costly = {
            **single,
            "strategy": "single:sim-frontier",
            "accuracy": 0.55,
            "cost_per_question_usd": 0.01,
        }
        moa = {**row, "strategy": "moa", "kind": "moa", "tokens_per_question": 10_000.0}
        pooled = [{**row, "cost_per_question_usd": 0.004}, single, costly, moa]
        document = {"planner": planner, "suites": {"gsm8k": [single, row], "all suites": pooled}}
        (directory / "report.json").write_text(json.dumps(document))

    report(tmp_path / "a", "transformers:base", 0.5, 0.7)
    report(tmp_path / "b", "transformers:trained", 0.6, 0.8)
    script = Path(__file__).parents[2] / "scripts" / "compare_evals.py"
    done = subprocess.run(
        [sys.executable, str(script), f"base={tmp_path / 'a'}", f"trained={tmp_path / 'b'}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert lines[1].startswith(
        "| base | transformers:base | conductor-grpo | 10 | 50.0% | 20.0% - 80.0% | 0.700"
    )
    assert lines[2].startswith("| trained | transformers:trained | conductor-grpo | 10 | 60.0% |")
    # Over all suites, beside the baselines: 40% of the best single worker's cost (frontier,
    # 55%), 12% of MoA's tokens; the trained run meets every mark but the valid-plan one.
    assert (
        "| trained | conductor-grpo | 10 | 60.0% | 20.0% - 80.0% | 0.004000 | 40% | 1,234 | 12% |"
        in done.stdout
    )
    assert "| baseline | single:sim-frontier | 10 | 55.0% |" in done.stdout
    assert "- [x] accuracy 60.0% against the best single worker's 55.0% (+5.0%)" in done.stdout
    assert "- [x] cost 40% of the best single worker's (mark: 60%)" in done.stdout
    assert "- [x] tokens 12% of MoA's (mark: 25%)" in done.stdout
    assert "- [ ] valid plans 90.0% (mark: 98%)" in done.stdout
    missing = subprocess.run(
        [sys.executable, str(script), f"x={tmp_path / 'nowhere'}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1
    assert "report.json" in missing.stderr
