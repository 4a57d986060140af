"""``conductor router train --traces``: exported one-step workflows with feedback or a reference
label become partial routing labels beside evaluation results; everything else is counted."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from conductor.chat import ChatMessage
from conductor.errors import ConfigurationError, WorkerUnavailable
from conductor.executor import WorkflowExecutor
from conductor.pool import Price
from conductor.variants import BUILTIN_VARIANTS
from conductor_adapters.store.db import make_engine
from conductor_adapters.store.models import WorkflowRow
from conductor_adapters.store.traces import TraceStore
from conductor_evaluation import ItemResult, is_held_out
from conductor_planner import ConductorPlanner
from conductor_router import load_router_model
from conductor_trainer import export as export_module
from conductor_trainer.export import export_rows
from conductor_trainer.routing_data import combine_routing_data, routing_data, train_router
from conductor_trainer.trace_routing import (
    DUPLICATE,
    NOT_COMPLETED,
    NOT_ITS_WORKER,
    NOT_ONE_STEP,
    UNLABELLED,
    trace_routing_data,
)

from fakes.scripted import ScriptedBackend, ScriptedWorker, lists, named_pool, scripted_gateway

NAMES = ["alpha", "beta", "gamma"]  # gamma cannot be called: its fallback beta answers


def _answer(text: str) -> Callable[[list[ChatMessage]], str]:
    return lambda messages: text


async def _run_workflows(url: str) -> list[str]:
    """Six workflows through the real executor and trace store, with priced workers."""
    engine = make_engine(url)
    pool = named_pool(NAMES, price=Price(input=1.0, output=2.0), fallbacks={"gamma": ["beta"]})
    workers = {
        "alpha": ScriptedWorker("alpha", answer=_answer("Answer: 4")),
        "beta": ScriptedWorker("beta", answer=_answer("Answer: 5")),
        "gamma": ScriptedWorker("gamma", fail_with=WorkerUnavailable("no key")),
    }
    one = [lists([m], ["Solve it."], [[]]) for m in (0, 1, 0, 2, 0)]
    two = lists([0, 1], ["Solve it.", "Check it."], [[], ["all"]])
    executor = WorkflowExecutor(
        planner=ConductorPlanner(ScriptedBackend(outputs=[*one, two])),
        pool=pool,
        gateway=scripted_gateway(pool, workers),
        observers=[TraceStore(engine, pool)],
    )
    ids = []
    for n in range(6):
        variant = BUILTIN_VARIANTS["conductor-ultra" if n == 5 else "conductor-mini"]
        result = await executor.run(f"What is 2+2? ({n})", variant)
        ids.append(str(result.workflow_id))
    engine.dispose()
    return ids


@pytest.mark.postgres
def test_exported_one_step_workflows_with_feedback_or_reference_are_routing_labels(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export_module, "BATCH", 4)  # steps are fetched batch by batch: two here
    right, wrong, feedback, fallback, _unlabelled, two_steps = asyncio.run(
        _run_workflows(postgres_url)
    )
    reference = {"reference": "4", "kind": "exact"}
    engine = make_engine(postgres_url)
    table: Any = WorkflowRow.__table__  # type: ignore[attr-defined]
    with engine.begin() as conn:
        for workflow, values in (
            (right, {"labels": reference}),  # alpha said 4: right
            (wrong, {"labels": reference}),  # beta said 5: wrong
            (feedback, {"labels": reference, "feedback": 0.25}),  # feedback wins
            (fallback, {"feedback": 1.0}),
            (two_steps, {"feedback": 1.0}),
        ):
            conn.execute(update(table).where(table.c.id == uuid.UUID(workflow)).values(**values))
    exported = list(export_rows(engine, BUILTIN_VARIANTS))
    engine.dispose()
    by_id = {row["workflow_id"]: row for row in exported}
    (step,) = by_id[right]["steps"]
    assert {k: step[k] for k in ("index", "kind", "worker", "answered_by", "status")} == {
        "index": 0,
        "kind": "worker",
        "worker": "alpha",
        "answered_by": "alpha",
        "status": "succeeded",
    }
    assert step["cost_usd"] > 0
    assert by_id[right]["cost_usd"] >= step["cost_usd"]
    assert [(s["worker"], s["answered_by"]) for s in by_id[fallback]["steps"]] == [
        ("gamma", "beta")
    ]
    assert [s["worker"] for s in by_id[two_steps]["steps"]] == ["alpha", "beta"]
    # A row that failed is known only from its status: make one of the exported rows so.
    failed = {**by_id[right], "workflow_id": str(uuid.uuid4()), "status": "failed"}
    export = tmp_path / "traces.jsonl"
    lines = [json.dumps(row) for row in [*exported, failed]]
    export.write_text("\n".join(lines) + "\n")

    data, summary = trace_routing_data([export, export])  # given twice: read once

    assert data.workers == ["alpha", "beta"]
    assert [item.id for item in data.items] == [right, wrong, feedback]
    assert {item.suite for item in data.items} == {"traces"}
    np.testing.assert_array_equal(data.right, [[1.0, np.nan], [np.nan, 0.0], [0.25, np.nan]])
    assert data.cost[0, 0] == step["cost_usd"]
    assert data.cost[1, 1] == by_id[wrong]["steps"][0]["cost_usd"]
    assert (summary.rows, dict(summary.sources)) == (14, {"reference": 2, "feedback": 1})
    assert dict(summary.skipped) == {
        NOT_ITS_WORKER: 1,
        UNLABELLED: 1,
        NOT_ONE_STEP: 1,
        NOT_COMPLETED: 1,
        DUPLICATE: 7,
    }
    assert "3 of 14 traced workflows are routing observations" in summary.describe()


def _row(n: int, worker: str, feedback: float | None, **fields: Any) -> dict[str, Any]:
    """A row as ``conductor traces export`` writes it (the exporter is tested above)."""
    return {
        "workflow_id": f"00000000-0000-0000-0000-{n:012d}",
        "question": f"What is {n} + 1?",
        "pool": ["a", "b", "c"],
        "output": "plan",
        "status": "completed",
        "answer": f"Answer: {n + 1}",
        "feedback": feedback,
        "reward": feedback,
        "reference": None,
        "labels": {},
        "steps": [
            {
                "index": 0,
                "round": 0,
                "kind": "worker",
                "worker": worker,
                "answered_by": worker,
                "status": "succeeded",
                "cost_usd": {"a": 0.001, "b": 0.0001, "c": 0.01}[worker],
            }
        ],
        "cost_usd": 0.002,
        **fields,
    }


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (
            [json.dumps(_row(0, "a", 1.0)), "{not json"],
            r"traces\.jsonl: line 2: invalid JSON",
        ),
        (
            [json.dumps({"suite": "gsm8k", "item_id": "1", "strategy": "single:a"})],
            r"traces\.jsonl: line 1: not a row of `conductor traces export`",
        ),
        (
            [json.dumps({"id": "1", "question": "q", "answer": "4", "kind": "math"})],
            "an --as-suite file cannot be learnt from",
        ),
        (
            [json.dumps({k: v for k, v in _row(0, "a", 1.0).items() if k != "steps"})],
            r"line 1: the row has no steps \(exported by an older version\)",
        ),
        (
            ["", json.dumps(_row(0, "a", 1.0, pool=["b"]))],
            r"traces\.jsonl: line 2: step worker 'a' is not in the row's pool \(b\)",
        ),
        ([json.dumps(_row(0, "a", 1.5))], r"line 1: feedback: Input should be less than"),
    ],
)
def test_a_file_that_is_not_a_trace_export_is_refused_naming_file_and_line(
    tmp_path: Path, lines: list[str], problem: str
) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigurationError, match=problem):
        trace_routing_data([path])


def _eval_dir(tmp_path: Path, count: int) -> Path:
    """An evaluation of ``count`` items by workers a and b (a right on even items)."""
    suite = tmp_path / "items.jsonl"
    suite.write_text(
        "".join(
            json.dumps(
                {"id": str(n), "question": f"Compute {n} * 3.", "answer": 3 * n, "kind": "math"}
            )
            + "\n"
            for n in range(count)
        )
    )
    run = tmp_path / "eval"
    run.mkdir()
    (run / "results.jsonl").write_text(
        "".join(
            ItemResult(
                suite=str(suite),
                item_id=str(n),
                strategy=f"single:{worker}",
                correct=(n % 2 == 0) == (worker == "a"),
                status="completed",
                cost_usd={"a": 0.001, "b": 0.0001}[worker],
            ).model_dump_json()
            + "\n"
            for n in range(count)
            for worker in ("a", "b")
        )
    )
    return run


def _traces(tmp_path: Path, count: int) -> Path:
    """``count`` one-step workflows, each worker in turn, right on every other question."""
    workers = ["a", "b", "c"]
    return _write(
        tmp_path / "traces.jsonl",
        [_row(n, workers[n % 3], float(n % 2)) for n in range(count)],
    )


def test_trace_labels_join_evaluation_results_and_split_by_workflow(tmp_path: Path) -> None:
    from conductor_router import QuestionEmbedder

    evaluated = routing_data([_eval_dir(tmp_path, 40)])
    traced, _ = trace_routing_data([_traces(tmp_path, 40)])

    data = combine_routing_data([evaluated, traced])

    assert data.workers == ["a", "b", "c"]  # c ran in traces only
    assert len(data.items) == 80
    assert np.isnan(data.right[:40, 2]).all()  # the evaluation never ran c
    known = ~np.isnan(data.right[40:])
    assert known.sum(axis=1).tolist() == [1] * 40  # one worker per traced question
    assert data.right[40:][known].tolist() == [float(n % 2) for n in range(40)]
    traced_held = data.held_out[40:]
    assert traced_held.tolist() == [is_held_out(item) for item in traced.items]
    assert data.items[40].key == "traces/00000000-0000-0000-0000-000000000000"
    assert 0 < traced_held.sum() < 40  # traced items fall on both sides

    models, report = train_router(data, QuestionEmbedder())

    assert list(models) == ["router", "knn", "cluster"]
    assert {w.name: w.trained_on for w in models["router"].workers} == {
        worker: int((~data.held_out & ~np.isnan(data.right[:, j])).sum())
        for j, worker in enumerate(data.workers)
    }
    # Judged on the held-out evaluated items only: no traced item was run by every worker.
    assert report["held_out_items"] == 0
    assert report["held_out_partial_items"] == int(data.held_out.sum())
    assert "no held-out item was run by every worker" in report["note"]

    without_c = combine_routing_data([evaluated, _only(traced, ["a", "b"])])
    _, judged = train_router(without_c, QuestionEmbedder())
    assert judged["held_out_items"] == int(without_c.held_out[:40].sum()) > 0
    assert judged["held_out_partial_items"] == int(without_c.held_out[40:].sum())
    assert {c["name"] for c in judged["curves"]} == {"router", "knn", "cluster"}


def _only(data: Any, workers: list[str]) -> Any:
    """``data`` without the items of other workers."""
    from conductor_trainer.routing_data import RoutingData

    columns = [data.workers.index(w) for w in workers]
    keep = ~np.isnan(data.right[:, columns]).all(axis=1)
    return RoutingData(
        [item for item, k in zip(data.items, keep, strict=True) if k],
        workers,
        data.right[keep][:, columns],
        data.cost[keep][:, columns],
    )


def test_router_train_learns_from_traces_alone_and_says_it_cannot_judge(tmp_path: Path) -> None:
    from conductor_cli import app

    export = _traces(tmp_path, 30)
    out = tmp_path / "router.json"
    (tmp_path / "router.report.png").write_bytes(b"an earlier run's plot")
    runner = CliRunner()

    done = runner.invoke(app, ["router", "train", "--traces", str(export), "--out", str(out)])

    assert done.exit_code == 0, done.output
    output = " ".join(done.output.split())  # unwrapped
    assert "30 of 30 traced workflows are routing observations (30 by feedback" in output
    assert "no held-out item was run by every worker" in output
    assert {w.name for w in load_router_model(out).workers} == {"a", "b", "c"}
    for head in ("knn", "cluster"):  # the baselines, routers of their own, beside it
        assert load_router_model(tmp_path / f"router.{head}.json").head == head
    report = json.loads((tmp_path / "router.report.json").read_text())
    assert report["held_out_items"] == 0
    assert not (tmp_path / "router.report.png").exists()

    nothing = runner.invoke(app, ["router", "train"])
    assert isinstance(nothing.exception, ConfigurationError)
    assert "nothing to learn from" in str(nothing.exception)
    unlabelled = _write(tmp_path / "plain.jsonl", [_row(0, "a", None)])
    refused = runner.invoke(app, ["router", "train", "--traces", str(unlabelled)])
    assert isinstance(refused.exception, ConfigurationError)
    assert "no traced workflow can be learnt from" in str(refused.exception)
    assert f"skipped: 1 {UNLABELLED}" in " ".join(refused.output.split())


def test_baselines_average_only_the_known_results() -> None:
    """knn and cluster score a worker by the results known in a neighbourhood: a traced
    question another worker ran says nothing about this one (it is not a wrong answer)."""
    from conductor_router import known_mean

    right = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    known = np.array([[True, False], [True, True], [False, False]])
    prior = np.array([0.9, 0.7])
    assert known_mean(right, known, prior).tolist() == [0.5, 0.0]
    assert known_mean(right, np.zeros_like(known), prior).tolist() == [0.9, 0.7]
    complete = np.random.default_rng(0).random((5, 15, 4))  # (items, neighbours, workers)
    np.testing.assert_array_equal(
        known_mean(complete, np.ones_like(complete, dtype=bool), prior[:1]),
        complete.mean(axis=1),
    )
