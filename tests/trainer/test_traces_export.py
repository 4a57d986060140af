"""``conductor traces export``: finished workflows as training rows, per tenant, atomically."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import update

from conductor.executor import WorkflowExecutor
from conductor.variants import BUILTIN_VARIANTS
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.models import WorkflowRow
from conductor_adapters.store.traces import TraceStore
from conductor_planner import ConductorPlanner

from fakes.cli import run_conductor
from fakes.scripted import ScriptedBackend, ScriptedWorker, lists, named_pool, scripted_gateway

NAMES = ["alpha", "beta"]


async def _run_workflows(url: str, outputs: list[str]) -> list[str]:
    upgrade(url)
    engine = make_engine(url)
    pool = named_pool(NAMES)
    executor = WorkflowExecutor(
        planner=ConductorPlanner(ScriptedBackend(outputs=outputs)),
        pool=pool,
        gateway=scripted_gateway(pool, {n: ScriptedWorker(n) for n in NAMES}),
        observers=[TraceStore(engine, pool)],
    )
    ids = []
    for _ in outputs:
        result = await executor.run("What is 2+2?", BUILTIN_VARIANTS["conductor-ultra"])
        ids.append(str(result.workflow_id))
    engine.dispose()
    return ids


def _export(url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_conductor(
        "traces", "export", "--out", str(out), *args, env={"CONDUCTOR_DATABASE_URL": url}
    )


@pytest.mark.processes
async def test_export_writes_prompt_output_reward_and_reference(
    sqlite_url: str, tmp_path: Path
) -> None:
    valid = lists([1, 0], ["Solve it.", "Check the answer above."], [[], ["all"]])
    first, second = await _run_workflows(sqlite_url, [valid, "no lists here"])
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(
            update(WorkflowRow.__table__)  # type: ignore[arg-type]
            .where(WorkflowRow.__table__.c.id == uuid.UUID(first))  # type: ignore[attr-defined]
            .values(feedback=0.75, labels={"reference": "4", "tenant": "x"}, tenant="acme")
        )
    engine.dispose()
    out = tmp_path / "rows.jsonl"

    done = _export(sqlite_url, out)

    assert done.returncode == 0, done.stderr
    assert "exported 2 workflows" in done.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {r["workflow_id"]: r for r in rows}
    row = by_id[first]
    # The pool as the Conductor was shown it, itself included (conductor-ultra may recurse).
    assert row["pool"] == [*NAMES, "conductor"]
    assert row["question"] == "What is 2+2?"
    assert row["prompt"][0]["role"] == "system"
    assert "Model 1" in row["prompt"][1]["content"]
    assert row["output"] == valid
    assert row["plan_valid"] is True
    assert row["output_lists"].startswith("model_id = [1, 0]")
    assert (row["reward"], row["reference"], row["tenant"]) == (0.75, "4", "acme")
    assert by_id[second]["plan_valid"] is False
    assert by_id[second]["output_lists"] is None
    assert by_id[second]["reward"] is None

    only_acme = _export(sqlite_url, out, "--tenant", "acme")
    assert only_acme.returncode == 0
    assert [json.loads(line)["workflow_id"] for line in out.read_text().splitlines()] == [first]
    bad = _export(sqlite_url, out, "--since", "yesterday")
    assert bad.returncode == 2
    assert "not an ISO date" in bad.stderr
    assert not (tmp_path / "rows.jsonl.partial").exists()


@pytest.mark.processes
async def test_labelled_workflows_export_as_a_suite_training_reads(
    sqlite_url: str, tmp_path: Path
) -> None:
    """--as-suite: the reference label is the answer; unlabelled workflows are skipped."""
    from conductor_evaluation.datasets import load_suite
    from conductor_evaluation.items import AnswerKind

    valid = lists([1], ["Solve it."], [[]])
    labelled, plain, odd = await _run_workflows(sqlite_url, [valid, valid, valid])
    engine = make_engine(sqlite_url)
    table = WorkflowRow.__table__
    with engine.begin() as conn:
        for workflow, labels in (
            (labelled, {"reference": "4", "kind": "math", "domain": "math"}),
            (odd, {"reference": "4", "kind": "code"}),  # code needs tests: not exportable
        ):
            conn.execute(
                update(table)  # type: ignore[arg-type]
                .where(table.c.id == uuid.UUID(workflow))  # type: ignore[attr-defined]
                .values(labels=labels)
            )
    engine.dispose()
    out = tmp_path / "suite.jsonl"

    done = _export(sqlite_url, out, "--as-suite")

    assert done.returncode == 0, done.stderr
    assert "exported 1 workflows" in done.stdout
    assert "skipped 2" in done.stdout
    items = load_suite(str(out))
    assert [(i.id, i.answer, i.kind) for i in items] == [(labelled, "4", AnswerKind.MATH)]
    assert items[0].question.startswith("What is 2+2?")
    assert plain not in out.read_text()
