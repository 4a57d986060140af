"""Workflows run by the executor leave complete traces, invalid Conductor output included."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select

from conductor.executor import WorkflowExecutor
from conductor.pool import Pool, Price, Provider, WorkerSpec
from conductor.variants import BUILTIN_VARIANTS
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.models import event_table
from conductor_adapters.store.traces import TraceStore
from conductor_planner import ConductorPlanner

from fakes.scripted import ScriptedBackend, ScriptedWorker, lists, scripted_gateway

NAMES = ["alpha", "beta"]
POOL = Pool(
    workers=tuple(
        WorkerSpec(
            name=n,
            provider=Provider.OPENAI_COMPATIBLE,
            model=n,
            base_url="http://127.0.0.1:9",
            price=Price(input=1.0, output=4.0),
        )
        for n in NAMES
    )
)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[TraceStore]:
    upgrade(database_url)
    engine = make_engine(database_url)
    yield TraceStore(engine, POOL)
    engine.dispose()


def _executor(outputs: list[str], store: TraceStore) -> WorkflowExecutor:
    return WorkflowExecutor(
        planner=ConductorPlanner(ScriptedBackend(outputs=outputs)),
        pool=POOL,
        gateway=scripted_gateway(POOL, {n: ScriptedWorker(n) for n in NAMES}),
        observers=[store],
    )


async def test_invalid_conductor_output_is_recorded_as_invalid(store: TraceStore) -> None:
    garbage = "model_id = [9]\nsubtasks = ['x']\naccess_list = [[]]"

    result = await _executor([garbage], store).run(
        "What is 2+2?", BUILTIN_VARIANTS["conductor-ultra"]
    )

    row = await store.get_workflow(result.workflow_id)
    assert row is not None
    assert row.status == "completed"
    assert row.plan_valid is False
    (call,) = row.planner_calls
    assert call["valid"] is False
    assert call["raw_output"] == garbage
    assert any("not in the pool" in e for e in call["errors"])
    assert [(p["worker"], p["subtask"]) for p in row.plan] == [("alpha", "Answer the question.")]


async def test_trace_totals_equal_steps_plus_conductor(store: TraceStore) -> None:
    plan = lists([0, 1, 0], ["a", "b", "c"], [[], [], ["all"]])

    result = await _executor([plan], store).run("q", BUILTIN_VARIANTS["conductor-ultra"])

    row = await store.get_workflow(result.workflow_id)
    assert row is not None
    steps = await store.list_steps(result.workflow_id)
    assert [s.index for s in steps] == [0, 1, 2]
    assert row.plan_valid is True
    conductor_tokens = sum(
        c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"] for c in row.planner_calls
    )
    assert row.total_tokens == conductor_tokens + sum(
        s.prompt_tokens + s.completion_tokens for s in steps
    )
    assert row.cost_usd == pytest.approx(sum(s.cost_usd for s in steps))
    for step in steps:
        attempts = await store.list_attempts(step.id)
        assert [a.status for a in attempts] == ["ok"]
    assert row.answer == result.answer


async def test_cancelling_during_a_replan_leaves_no_step_running(store: TraceStore) -> None:
    first = lists([0, 2], ["Solve.", "Review."], [[], ["all"]])
    backend = ScriptedBackend(outputs=[first])
    replanning = asyncio.Event()
    original = backend.generate

    async def slow_second_call(*args: Any, **kwargs: Any) -> Any:
        if backend.requests:  # the first call is done: this is the re-plan
            replanning.set()
            await asyncio.sleep(60)
        return await original(*args, **kwargs)

    backend.generate = slow_second_call  # type: ignore[method-assign]
    executor = WorkflowExecutor(
        planner=ConductorPlanner(backend),
        pool=POOL,
        gateway=scripted_gateway(POOL, {n: ScriptedWorker(n) for n in NAMES}),
        observers=[store],
    )
    workflow_id = uuid.uuid4()
    task = asyncio.create_task(
        executor.run("q", BUILTIN_VARIANTS["conductor-ultra"], workflow_id=workflow_id)
    )
    await asyncio.wait_for(replanning.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    row = await store.get_workflow(workflow_id)
    assert row is not None
    steps = await store.list_steps(workflow_id)
    assert row.status == "failed"
    assert row.error == "cancelled before it finished"
    assert [(s.kind, s.status) for s in steps] == [
        ("worker", "succeeded"),
        ("conductor", "cancelled"),
    ]


async def test_the_embedded_runtime_keeps_the_numbered_events_clients_stream(
    store: TraceStore, database_url: str
) -> None:
    plan = lists([0, 1], ["a", "b"], [[], [0]])

    result = await _executor([plan], store).run("q", BUILTIN_VARIANTS["conductor-ultra"])

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            query = select(event_table.c.sequence, event_table.c.kind, event_table.c.payload)
            rows = conn.execute(
                query.where(event_table.c.workflow_id == result.workflow_id).order_by(
                    event_table.c.sequence
                )
            ).all()
    finally:
        engine.dispose()
    assert [r.sequence for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r.kind for r in rows] == [
        "plan",
        "step_started",
        "step_finished",
        "step_started",
        "step_finished",
        "completed",
    ]
    assert rows[-1].payload["answer"] == result.answer
    assert rows[2].payload["status"] == "succeeded"


async def test_nul_characters_in_model_output_are_stored_the_same_on_both_stores(
    store: TraceStore, database_url: str
) -> None:
    """PostgreSQL refuses NUL in text and JSONB, SQLite keeps it: model output is untrusted, so
    both store it with U+FFFD in its place, and the trace is complete."""
    plan = "\x00" + lists([0, 1], ["solve\x00", "check"], [[], [0]])
    executor = WorkflowExecutor(
        planner=ConductorPlanner(ScriptedBackend(outputs=[plan])),
        pool=POOL,
        gateway=scripted_gateway(
            POOL,
            {
                "alpha": ScriptedWorker("alpha", answer=lambda _: "four\x00"),
                "beta": ScriptedWorker("beta", answer=lambda _: "\x00 still four"),
            },
        ),
        observers=[store],
    )

    result = await executor.run("q", BUILTIN_VARIANTS["conductor-ultra"])

    row = await store.get_workflow(result.workflow_id)
    assert row is not None
    steps = await store.list_steps(result.workflow_id)
    assert (row.status, row.answer) == ("completed", "\ufffd still four")
    assert [s.output for s in steps] == ["four\ufffd", "\ufffd still four"]
    assert steps[0].subtask == "solve\ufffd"
    assert row.planner_calls[0]["raw_output"].startswith("\ufffd")
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            kinds = conn.execute(
                select(event_table.c.kind).where(event_table.c.workflow_id == result.workflow_id)
            ).scalars()
            assert list(kinds)[-1] == "completed"
    finally:
        engine.dispose()
