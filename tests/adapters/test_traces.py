"""Trace persistence: migrations match the models, the store round-trips, writes are idempotent."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, delete, func, inspect, select, text
from sqlalchemy import event as sqlalchemy_event

from conductor.chat import Usage
from conductor.machine import EventKind, MachineEvent
from conductor.pool import Pool, Provider, WorkerSpec
from conductor.workflow import (
    AttemptRecord,
    Plan,
    PlanOutcome,
    PlanStep,
    PoolEntry,
    StepRecord,
    StepStatus,
    WorkflowRecord,
    WorkflowStatus,
)
from conductor_adapters.store import db
from conductor_adapters.store.db import (
    DatabaseUnavailableError,
    alembic_config,
    make_engine,
    redact_url,
    upgrade,
    wait_for_database,
)
from conductor_adapters.store.models import metadata, step_table, workflow_table
from conductor_adapters.store.traces import TraceStore

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def outcome(round_: int = 0, valid: bool = True) -> PlanOutcome:
    plan = Plan(
        steps=(
            PlanStep(model_id=1, subtask="Solve 17 * 23 step by step."),
            PlanStep(model_id=0, subtask="Check the answer above.", access_list=("all",)),
        )
    )
    return PlanOutcome(
        round=round_,
        raw_output=f"Reasoning.\n{plan.as_lists_text()}",
        valid=valid,
        errors=[] if valid else ["model_id 7 is not in the pool"],
        plan=plan,
        pool=[PoolEntry(name="small", description="fast"), PoolEntry(name="big", description="")],
        usage=Usage(prompt_tokens=300, completion_tokens=60),
        backend="fake",
    )


def step(index: int, worker: str, output: str, attempts: list[AttemptRecord]) -> StepRecord:
    return StepRecord(
        index=index,
        round=0,
        worker=worker,
        subtask=f"subtask {index}",
        access_list=[] if index == 0 else ["all"],
        visible_steps=list(range(index)),
        status=StepStatus.SUCCEEDED,
        output=output,
        usage=sum((a.usage for a in attempts), Usage()),
        cost_usd=sum(a.cost_usd for a in attempts),
        latency_ms=sum(a.latency_ms for a in attempts),
        started_at=T0 + timedelta(seconds=index),
        finished_at=T0 + timedelta(seconds=index + 1),
        attempts=attempts,
    )


def attempt(number: int, ok: bool, tokens: int = 0, error: str | None = None) -> AttemptRecord:
    return AttemptRecord(
        number=number,
        status="ok" if ok else "error",
        error_class=None if ok else "RateLimited",
        error=error if error else (None if ok else "429 Too Many Requests"),
        status_code=200 if ok else 429,
        usage=Usage(prompt_tokens=tokens, completion_tokens=tokens // 2),
        cost_usd=0.001 if ok else 0.0,
        latency_ms=100.0,
        started_at=T0 + timedelta(milliseconds=number),
    )


def finished_result() -> WorkflowRecord:
    steps = [
        step(0, "big", "391", [attempt(1, ok=False), attempt(2, ok=True, tokens=40)]),
        step(1, "small", "391 is correct.", [attempt(1, ok=True, tokens=80)]),
    ]
    return WorkflowRecord(
        workflow_id=uuid.uuid4(),
        variant="conductor-ultra",
        question="What is 17 * 23?",
        status=WorkflowStatus.COMPLETED,
        planner_calls=[outcome()],
        steps=steps,
        answer="391 is correct.",
        usage=outcome().usage + steps[0].usage + steps[1].usage,
        cost_usd=0.002,
        latency_ms=2500.0,
        created_at=T0,
        finished_at=T0 + timedelta(seconds=3),
    )


def machine_event(kind: EventKind, sequence: int, **fields: Any) -> MachineEvent:
    return MachineEvent(kind=kind, sequence=sequence, at=T0, **fields)


async def replay(
    store: TraceStore, final: WorkflowRecord, workers: Sequence[str] = ("big",)
) -> None:
    """Deliver the events in the order the executor does, each with the record as it was."""
    running = final.model_copy(update={"status": WorkflowStatus.RUNNING, "answer": None})
    await store.observe(running, [machine_event(EventKind.STARTED, 0, workers=list(workers))])
    sequence = 0
    for call in final.planner_calls:
        sequence += 1
        await store.observe(running, [machine_event(EventKind.PLAN, sequence, round=call.round)])
    for i, record in enumerate(final.steps):
        started = record.model_copy(
            update={"status": StepStatus.RUNNING, "output": None, "attempts": []}
        )
        sequence += 1
        now = running.model_copy(update={"steps": [*final.steps[:i], started]})
        await store.observe(now, [machine_event(EventKind.STEP_STARTED, sequence, step=i)])
        sequence += 1
        now = running.model_copy(update={"steps": final.steps[: i + 1]})
        await store.observe(now, [machine_event(EventKind.STEP_FINISHED, sequence, step=i)])
    outcome_kind = (
        EventKind.COMPLETED if final.status is WorkflowStatus.COMPLETED else EventKind.FAILED
    )
    await store.observe(final, [machine_event(outcome_kind, sequence + 1)])


def dump(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return {
            table.name: [
                dict(row._mapping)
                for row in conn.execute(select(table).order_by(*table.primary_key.columns))
            ]
            for table in metadata.sorted_tables
        }


POOL = Pool(
    workers=(
        WorkerSpec(name="big", provider=Provider.OPENAI, model="gpt-4o"),
        WorkerSpec(name="small", provider=Provider.OPENAI, model="gpt-4o-mini"),
    )
)
SNAPSHOT = [POOL.workers[0].snapshot()]


# -- schema ---------------------------------------------------------------------------------


def test_migrated_schema_matches_models(database_url: str) -> None:
    # Given a database migrated to head
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            # When Alembic compares it with the SQLModel metadata
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            diff = compare_metadata(context, metadata)
            inspector = inspect(conn)
            unique = [uq["name"] for uq in inspector.get_unique_constraints("step")]
            fks = inspector.get_foreign_keys("attempt")
            indexes = {ix["name"] for ix in inspector.get_indexes("workflow")}
    finally:
        engine.dispose()
    # Then there is no difference, and constraints carry the naming convention's names
    assert diff == []
    assert unique == ["uq_step_workflow_id_index"]
    assert [(fk["name"], fk["options"].get("ondelete")) for fk in fks] == [
        ("fk_attempt_step_id_step", "CASCADE")
    ]
    assert indexes == {
        "ix_workflow_tenant",
        "ix_workflow_status",
        "ix_workflow_created_at",
        "ix_workflow_runner_id",
        "ix_workflow_tenant_created",
        "ux_workflow_tenant_idempotency_key",
        "ix_workflow_key_created",
    }


def test_upgrade_is_idempotent(database_url: str) -> None:
    # Given a migrated database holding a workflow
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                workflow_table.insert().values(
                    id=uuid.uuid4(), variant="v", question="q", status="running"
                )
            )
        # When upgrade runs again
        upgrade(database_url)
        # Then it is still at head with its data intact
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
            count = conn.execute(select(func.count()).select_from(workflow_table)).scalar()
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert list(versions) == [head] == ["0014"]
    assert count == 1


async def test_deleting_a_workflow_cascades_to_steps_and_attempts(engine: Engine) -> None:
    # Given a stored workflow with steps and attempts
    result = finished_result()
    await replay(TraceStore(engine, POOL), result)
    # When the workflow row is deleted
    with engine.begin() as conn:
        conn.execute(delete(workflow_table).where(workflow_table.c.id == result.workflow_id))
    # Then nothing of it is left (foreign keys are enforced on SQLite too)
    assert dump(engine) == {
        "workflow": [],
        "step": [],
        "attempt": [],
        "workflow_run": [],
        "workflow_event": [],
        "api_key": [],
        "runner": [],
        "response": [],
        "webhook_delivery": [],
        "direct_call": [],
        "outbox": [],
        "tenant_retention": [],
    }


# -- store --------------------------------------------------------------------------------


async def test_round_trip(engine: Engine) -> None:
    # Given a finished workflow with 2 steps, the first retried once
    result = finished_result()
    store = TraceStore(engine, POOL, tenant="acme")
    # When the observer sees its events in order
    await replay(store, result)
    # Then the workflow row holds the final state and the Conductor's output
    row = await store.get_workflow(result.workflow_id)
    assert row is not None
    assert (row.tenant, row.variant, row.status) == ("acme", "conductor-ultra", "completed")
    assert (row.answer, row.error) == ("391 is correct.", None)
    assert row.prompt_tokens == 300 + 40 + 80
    assert row.completion_tokens == 60 + 20 + 40
    assert row.total_tokens == row.prompt_tokens + row.completion_tokens
    assert (row.cost_usd, row.latency_ms) == (0.002, 2500.0)
    assert row.created_at == T0
    assert row.created_at.tzinfo is not None
    assert row.finished_at == T0 + timedelta(seconds=3)
    assert row.pool_snapshot == SNAPSHOT
    assert row.plan_valid is True
    assert [c["raw_output"] for c in row.planner_calls] == [outcome().raw_output]
    assert row.planner_calls[0]["usage"]["prompt_tokens"] == 300
    assert row.plan == [
        {"round": 0, "model_id": 1, "worker": "big", "subtask": "Solve 17 * 23 step by step.",
         "access_list": []},
        {"round": 0, "model_id": 0, "worker": "small", "subtask": "Check the answer above.",
         "access_list": ["all"]},
    ]  # fmt: skip
    # And each step with its attempts
    steps = await store.list_steps(result.workflow_id)
    assert [(s.index, s.worker, s.status, s.output) for s in steps] == [
        (0, "big", "succeeded", "391"),
        (1, "small", "succeeded", "391 is correct."),
    ]
    assert (steps[1].access_list, steps[1].visible_steps) == (["all"], [0])
    assert steps[0].total_tokens == 60
    assert steps[0].started_at == T0
    first = await store.list_attempts(steps[0].id)
    assert [(a.number, a.status, a.error_class, a.status_code) for a in first] == [
        (1, "error", "RateLimited", 429),
        (2, "ok", None, 200),
    ]
    assert first[1].started_at == T0 + timedelta(milliseconds=2)
    # And another tenant cannot read it
    assert await store.get_workflow(result.workflow_id, tenant="other") is None


async def test_duplicate_events_change_nothing(engine: Engine) -> None:
    # Given a workflow recorded once
    result = finished_result()
    store = TraceStore(engine, POOL)
    await replay(store, result)
    before = dump(engine)
    # When its events are delivered again, some with different contents
    altered_step = result.steps[0].model_copy(
        update={"output": "999", "attempts": [*result.steps[0].attempts, attempt(3, ok=True)]}
    )
    altered = result.model_copy(update={"answer": "999", "status": WorkflowStatus.FAILED})
    invalid_plan = result.model_copy(update={"planner_calls": [outcome(valid=False)]})
    with_altered_step = result.model_copy(update={"steps": [altered_step, result.steps[1]]})
    events: list[Callable[[], Awaitable[None]]] = [
        lambda: store.observe(result, [machine_event(EventKind.STARTED, 0, workers=["small"])]),
        lambda: store.observe(invalid_plan, [machine_event(EventKind.PLAN, 1, round=0)]),
        lambda: store.observe(result, [machine_event(EventKind.STEP_STARTED, 4, step=1)]),
        lambda: store.observe(result, [machine_event(EventKind.STEP_FINISHED, 3, step=0)]),
        lambda: store.observe(
            with_altered_step, [machine_event(EventKind.STEP_FINISHED, 3, step=0)]
        ),
        lambda: store.observe(result, [machine_event(EventKind.COMPLETED, 6)]),
        lambda: store.observe(altered, [machine_event(EventKind.FAILED, 6)]),
        lambda: replay(store, result),
    ]
    for event in events:
        await event()
        await store.flush()
        # Then the database is exactly as before, after each one
        assert dump(engine) == before


async def test_progress_is_written_behind_and_the_outcome_before_observe_returns(
    engine: Engine,
) -> None:
    # Given a store whose commits are held, and a listener of what it stored
    store = TraceStore(engine, POOL)
    heard: list[tuple[int, bool]] = []
    store.on_stored.append(lambda _, last, final: heard.append((last, final)))
    held = threading.Event()

    def hold(_: object) -> None:
        held.wait(10)

    sqlalchemy_event.listen(engine, "commit", hold)
    try:
        result = finished_result()
        running = result.model_copy(update={"status": WorkflowStatus.RUNNING, "answer": None})
        # When a workflow's start is observed, then its outcome
        started = machine_event(EventKind.STARTED, 0, workers=["big"])
        await asyncio.wait_for(store.observe(running, [started]), 2)
        outcome = asyncio.create_task(
            store.observe(result, [machine_event(EventKind.COMPLETED, 6)])
        )
        await asyncio.sleep(0.2)
        # Then the start did not wait for its commit, the outcome does, and nothing uncommitted
        # was announced
        assert not outcome.done()
        assert heard == []
        held.set()
        await asyncio.wait_for(outcome, 10)
    finally:
        held.set()
        sqlalchemy_event.remove(engine, "commit", hold)
    # And once committed, both are announced in order, and the outcome is in the database
    assert heard == [(0, False), (6, True)]
    row = await store.get_workflow(result.workflow_id)
    assert row is not None
    assert row.status == "completed"


async def test_events_for_an_unknown_workflow_still_leave_a_trace(engine: Engine) -> None:
    # Given a store that missed the start and the step events
    result = finished_result()
    store = TraceStore(engine, POOL)
    # When only the outcome arrives
    await store.observe(result, [machine_event(EventKind.COMPLETED, 6)])
    # Then the workflow, its plan, steps and attempts are recorded
    row = await store.get_workflow(result.workflow_id)
    assert row is not None
    assert row.status == "completed"
    assert len(row.plan) == 2
    steps = await store.list_steps(result.workflow_id)
    assert [len(await store.list_attempts(s.id)) for s in steps] == [2, 1]


async def test_parallel_step_events_are_serialised(engine: Engine) -> None:
    # Given a workflow with 5 parallel steps
    result = finished_result()
    store = TraceStore(engine, POOL)
    records = [step(i, "big", str(i), [attempt(1, ok=True)]) for i in range(5)]
    result = result.model_copy(update={"steps": records})
    await store.observe(result, [machine_event(EventKind.STARTED, 0, workers=["big"])])
    # When their events arrive at once
    await asyncio.gather(
        *(
            store.observe(result, [machine_event(EventKind.STEP_FINISHED, i + 1, step=i)])
            for i in range(5)
        )
    )
    await store.flush()
    # Then every step and attempt is stored
    steps = await store.list_steps(result.workflow_id)
    assert [s.output for s in steps] == ["0", "1", "2", "3", "4"]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(step_table)).scalar() == 5


async def test_no_provider_key_is_stored(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a provider key in the environment, named by a worker and leaked by a careless caller
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("ACME_LLM_CREDENTIAL", secret)
    spec = WorkerSpec(
        name="acme", provider=Provider.OPENAI, model="m", api_key_env="ACME_LLM_CREDENTIAL"
    )
    snapshot = [
        spec.snapshot(),
        {"name": "leaky", "api_key": secret, "headers": {"Authorization": f"Bearer {secret}"}},
        {"name": "gemini", "base_url": f"https://example.test/v1?key={secret}"},
    ]
    result = finished_result()
    failing = attempt(3, ok=False, error=f"401 Incorrect API key provided: {secret}")
    record = result.steps[0].model_copy(update={"attempts": [failing]})
    result = result.model_copy(update={"steps": [record], "error": f"auth failed for {secret}"})
    # When the workflow is stored, its snapshot written as given (not rebuilt from the pool)
    store = TraceStore(engine, POOL)
    with engine.begin() as conn:
        store.writes.started(result, snapshot)(conn)
    await replay(store, result)
    # Then the key appears nowhere in the database, while the variable's name is kept
    everything = repr(dump(engine))
    assert secret not in everything
    assert "ACME_LLM_CREDENTIAL" in everything
    assert "[redacted]" in everything


# -- database helpers -------------------------------------------------------------------------


def test_sqlite_engine_creates_directory_and_enables_foreign_keys_and_wal(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    finally:
        engine.dispose()


def test_bare_postgres_scheme_uses_psycopg() -> None:
    engine = make_engine("postgresql://u:pw@db.example:5432/traces")
    try:
        assert engine.url.drivername == "postgresql+psycopg"
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_pooled_connection_the_database_closed_while_idle_is_replaced_unnoticed(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a PostgreSQL engine whose one pooled connection the server closes (a restart, an
    # idle timeout) while it sits in the pool
    monkeypatch.setattr(db, "IDLE_PING_S", 0.0)
    engine = make_engine(postgres_url)
    admin = make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with admin.begin() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

        # When the engine is used again, once it was idle
        with engine.connect() as conn:
            again = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()

        # Then the use succeeded, on a new connection
        assert again != pid
    finally:
        engine.dispose()
        admin.dispose()


def test_redact_url_hides_the_password() -> None:
    assert redact_url("postgresql+psycopg://u:s3cr%40t@h/db") == "postgresql+psycopg://u:***@h/db"
    assert redact_url("sqlite:///x.db") == "sqlite:///x.db"


def test_wait_for_database_returns_when_reachable(database_url: str) -> None:
    wait_for_database(database_url, timeout_s=5)


def test_wait_for_database_names_the_url_without_password() -> None:
    url = "postgresql://conductor:hunter2-secret@127.0.0.1:1/traces"
    with pytest.raises(DatabaseUnavailableError) as info:
        wait_for_database(url, timeout_s=0.3)
    message = str(info.value)
    assert "postgresql+psycopg://conductor:***@127.0.0.1:1/traces" in message
    assert "hunter2-secret" not in message
