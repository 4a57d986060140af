"""Trace retention: the deployment's policy and a tenant's own, training data kept until
exported, pruning in batches (export first when asked), and what bad input is told; on SQLite
and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text, update

from conductor.chat import Usage
from conductor.errors import InvalidRequest
from conductor.workflow import Plan, PlanOutcome, PlanStep, PoolEntry
from conductor_adapters.settings import get_settings
from conductor_adapters.store import retention
from conductor_adapters.store.db import make_engine
from conductor_adapters.store.models import (
    attempt_table,
    event_table,
    new_workflow_values,
    step_table,
    workflow_table,
)
from conductor_adapters.store.retention import RetentionPolicy

from fakes.cli import run_conductor, run_conductor_here

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PLANNED = [
    PlanOutcome(
        round=0,
        raw_output="model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]",
        valid=True,
        plan=Plan(steps=(PlanStep(model_id=0, subtask="Solve it."),)),
        pool=[PoolEntry(name="alpha", description="")],
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        backend="fake",
    ).model_dump(mode="json")
]


def add_workflow(
    engine: Engine,
    days_old: float,
    *,
    tenant: str = "default",
    status: str = "completed",
    feedback: float | None = None,
    labels: dict[str, str] | None = None,
    planned: bool = True,
    steps: int = 2,
    now: datetime = NOW,
) -> uuid.UUID:
    """A workflow created ``days_old`` days before ``now``, with its steps (two attempts each) and
    an event, as the trace store leaves one."""
    workflow_id = uuid.uuid4()
    created = now - timedelta(days=days_old)
    values = new_workflow_values(
        workflow_id,
        tenant=tenant,
        variant="conductor-ultra",
        question="What is 2+2?",
        status=status,
        created_at=created,
        labels=labels,
    )
    values.update(feedback=feedback, planner_calls=PLANNED if planned else [], answer="4")
    with engine.begin() as conn:
        conn.execute(workflow_table.insert().values(values))
        for index in range(steps):
            step_id = uuid.uuid4()
            conn.execute(
                step_table.insert().values(
                    id=step_id,
                    workflow_id=workflow_id,
                    index=index,
                    worker="alpha",
                    subtask="Solve it.",
                    access_list=[],
                    visible_steps=[],
                    status="succeeded",
                )
            )
            for number in (1, 2):
                conn.execute(
                    attempt_table.insert().values(
                        id=uuid.uuid4(),
                        step_id=step_id,
                        number=number,
                        worker="alpha",
                        status="ok" if number == 2 else "error",
                        started_at=created,
                    )
                )
        conn.execute(
            event_table.insert().values(
                workflow_id=workflow_id, sequence=1, kind="started", at=created, payload={}
            )
        )
    return workflow_id


def workflow_ids(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(conn.execute(select(workflow_table.c.id)).scalars())


def rows_of(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def prune(engine: Engine, policy: RetentionPolicy, **kwargs: Any) -> retention.PruneResult:
    return retention.prune(engine, policy, NOW, **kwargs)


# -- the policy -----------------------------------------------------------------------------


def test_the_deployments_retention_deletes_ended_workflows_past_it_and_their_rows(
    engine: Engine,
) -> None:
    # Given workflows of 1, 29 and 31 days, an old one still running and an old failed one
    recent = add_workflow(engine, 1)
    inside = add_workflow(engine, 29.9)
    old = add_workflow(engine, 31)
    running = add_workflow(engine, 40, status="running")
    failed = add_workflow(engine, 60, status="failed")
    policy = retention.load_policy(engine, 30)
    # When the dry run counts, then the prune runs
    counts = retention.count(engine, policy, NOW)
    result = prune(engine, policy)
    # Then the ended ones past 30 days are gone, with their steps, attempts and events
    assert [(c.scope.name, c.past_retention, c.to_delete) for c in counts] == [
        ("other tenants", 2, 2)
    ]
    assert (result.workflows, result.steps, result.attempts) == (2, 4, 8)
    assert workflow_ids(engine) == {recent, inside, running}
    assert old not in workflow_ids(engine)
    assert failed not in workflow_ids(engine)
    assert rows_of(engine, step_table) == 6
    assert rows_of(engine, attempt_table) == 12
    assert rows_of(engine, event_table) == 3


def test_without_a_deployment_retention_only_tenants_with_their_own_are_pruned(
    engine: Engine,
) -> None:
    # Given old workflows of three tenants, one keeping 7 days and one forever
    acme_old = add_workflow(engine, 8, tenant="acme")
    acme_new = add_workflow(engine, 6, tenant="acme")
    keeper = add_workflow(engine, 900, tenant="keeper")
    other = add_workflow(engine, 900, tenant="other")
    retention.set_tenant_retention(engine, "acme", 7)
    retention.set_tenant_retention(engine, "keeper", None)
    # When the deployment has no retention, then one of 30 days
    prune(engine, retention.load_policy(engine, None))
    after_first = workflow_ids(engine)
    prune(engine, retention.load_policy(engine, 30))
    # Then the tenant's own retention wins either way; forever is forever
    assert after_first == {acme_new, keeper, other}
    assert workflow_ids(engine) == {acme_new, keeper}
    assert acme_old not in after_first


def test_a_tenants_retention_is_set_replaced_listed_and_unset(engine: Engine) -> None:
    retention.set_tenant_retention(engine, "acme", 7)
    retention.set_tenant_retention(engine, "acme", 90)  # replaces
    retention.set_tenant_retention(engine, "beta", None)
    listed = [(t.tenant, t.days) for t in retention.list_tenant_retention(engine)]
    assert listed == [("acme", 90), ("beta", None)]
    assert retention.unset_tenant_retention(engine, "acme") is True
    assert retention.unset_tenant_retention(engine, "acme") is False
    policy = retention.load_policy(engine, 30)
    assert policy == RetentionPolicy(default_days=30, tenants={"beta": None})
    assert [(s.name, s.days) for s in retention.scopes(policy, NOW)] == [
        ("tenant beta", None),
        ("other tenants", 30),
    ]


def test_policy_is_empty_only_when_nothing_could_ever_be_deleted() -> None:
    assert RetentionPolicy(None).is_empty()
    assert RetentionPolicy(None, {"a": None}).is_empty()
    assert not RetentionPolicy(None, {"a": 3}).is_empty()
    assert not RetentionPolicy(30).is_empty()


# -- training data --------------------------------------------------------------------------


def test_training_data_is_kept_past_retention_until_exported(engine: Engine) -> None:
    # Given old workflows: with feedback, with a reference label, with another label, and one
    # with feedback that the Conductor never planned (the export has no row for it)
    rated = add_workflow(engine, 100, feedback=0.5)
    referenced = add_workflow(engine, 100, labels={"reference": "4", "team": "x"})
    plain = add_workflow(engine, 100, labels={"team": "x"})
    unplanned = add_workflow(engine, 100, feedback=1.0, planned=False)
    policy = retention.load_policy(engine, 30)
    # When pruned before any export
    counts = retention.count(engine, policy, NOW)
    prune(engine, policy)
    # Then the two training rows the export can write stay
    assert [(c.past_retention, c.kept_for_training, c.to_delete) for c in counts] == [(4, 2, 2)]
    assert workflow_ids(engine) == {rated, referenced}
    assert plain not in workflow_ids(engine)
    assert unplanned not in workflow_ids(engine)

    # When one of them is exported (its first export's time is kept), and pruned again
    assert retention.mark_exported(engine, [rated], NOW) == 1
    assert retention.mark_exported(engine, [rated, referenced], NOW + timedelta(hours=1)) == 1
    with engine.connect() as conn:
        marks = {
            r[0]: r[1]
            for r in conn.execute(select(workflow_table.c.id, workflow_table.c.exported_at))
        }
    assert marks == {rated: NOW, referenced: NOW + timedelta(hours=1)}
    prune(engine, policy)
    # Then both are gone: exported, they are past retention like any other
    assert workflow_ids(engine) == set()


def test_a_recent_exported_workflow_is_kept_to_the_end_of_its_retention(engine: Engine) -> None:
    fresh = add_workflow(engine, 2, feedback=1.0)
    retention.mark_exported(engine, [fresh], NOW)
    prune(engine, retention.load_policy(engine, 30))
    assert workflow_ids(engine) == {fresh}


# -- batches ----------------------------------------------------------------------------------


def test_prune_deletes_in_batches_oldest_first_each_committed(engine: Engine) -> None:
    # Given 10 old workflows, 2 of them kept for training, and 2 recent ones
    old = [add_workflow(engine, 100 - i, steps=1) for i in range(10)]
    for kept in (old[1], old[6]):
        with engine.begin() as conn:
            conn.execute(
                update(workflow_table).where(workflow_table.c.id == kept).values(feedback=1.0)
            )
    recent = {add_workflow(engine, 1), add_workflow(engine, 2)}
    seen: list[list[uuid.UUID]] = []
    committed: list[int] = []
    # When pruned 3 at a time
    result = prune(
        engine,
        retention.load_policy(engine, 30),
        batch_size=3,
        before_delete=lambda _conn, ids: seen.append(ids),
        on_batch=committed.append,
    )
    # Then each batch is the next 3 oldest (the kept ones are not read again), each committed
    deletable = [w for w in old if w not in (old[1], old[6])]
    assert seen == [deletable[0:3], deletable[3:6], deletable[6:8]]
    assert committed == [3, 3, 2]
    assert (result.workflows, result.batches) == (8, 3)
    assert workflow_ids(engine) == {old[1], old[6], *recent}


def test_a_batch_that_fails_is_rolled_back_and_stops_the_prune(engine: Engine) -> None:
    old = [add_workflow(engine, 100 - i, steps=1) for i in range(5)]
    calls = 0

    def fail_second(_conn: Any, _ids: list[uuid.UUID]) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        prune(engine, retention.load_policy(engine, 30), batch_size=2, before_delete=fail_second)
    # The first batch is gone; the second's rows are all there, children included
    assert workflow_ids(engine) == set(old[2:])
    assert rows_of(engine, step_table) == 3
    assert rows_of(engine, attempt_table) == 6


@pytest.mark.postgres
def test_on_postgres_a_batch_leaves_locked_rows_and_never_blocks_new_workflows(
    postgres_url: str,
) -> None:
    """The rows a live transaction holds are skipped, not waited for; and while a batch holds
    its rows, a new workflow (with its steps) is inserted and committed without waiting."""
    engine = make_engine(postgres_url)
    other = make_engine(postgres_url)
    try:
        held, free = add_workflow(engine, 100), add_workflow(engine, 99)
        inserted: list[float] = []

        def insert_meanwhile(_conn: Any, ids: list[uuid.UUID]) -> None:
            assert ids == [free]
            started = datetime.now(UTC)
            with other.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '1s'"))
                conn.execute(
                    workflow_table.insert().values(
                        new_workflow_values(
                            uuid.uuid4(),
                            tenant="default",
                            variant="v",
                            question="q",
                            status="running",
                            created_at=None,
                        )
                    )
                )
            inserted.append((datetime.now(UTC) - started).total_seconds())

        with engine.connect() as holder, holder.begin():
            holder.execute(
                select(workflow_table.c.id).where(workflow_table.c.id == held).with_for_update()
            )
            result = prune(
                engine, retention.load_policy(engine, 30), before_delete=insert_meanwhile
            )
        assert result.workflows == 1
        assert held in workflow_ids(engine)
        assert free not in workflow_ids(engine)
        assert len(inserted) == 1
        assert inserted[0] < 1.0
        # The next run takes the row once it is free
        assert prune(engine, retention.load_policy(engine, 30)).workflows == 1
    finally:
        engine.dispose()
        other.dispose()


# -- bad input ------------------------------------------------------------------------------


def test_bad_retention_input_is_refused_with_the_reason(engine: Engine) -> None:
    with pytest.raises(InvalidRequest, match="1 to 36500 days"):
        retention.set_tenant_retention(engine, "acme", 0)
    with pytest.raises(InvalidRequest, match="tenant 'Acme Corp'"):
        retention.set_tenant_retention(engine, "Acme Corp", 3)
    with pytest.raises(InvalidRequest, match="CONDUCTOR_TRACE_RETENTION_DAYS 0"):
        retention.load_policy(engine, 0)
    with pytest.raises(InvalidRequest, match="batch size 0"):
        prune(engine, RetentionPolicy(30), batch_size=0)


# -- the command ----------------------------------------------------------------------------


@pytest.fixture
def cli_database(
    engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Engine]:
    """The CLI's settings point at the test's database (in this process)."""
    monkeypatch.setenv("CONDUCTOR_DATABASE_URL", database_url)
    monkeypatch.delenv("CONDUCTOR_TRACE_RETENTION_DAYS", raising=False)
    get_settings.cache_clear()
    yield engine
    get_settings.cache_clear()


def test_prune_exports_what_it_deletes_first_in_the_exports_row_shape(
    cli_database: Engine, tmp_path: Path
) -> None:
    engine = cli_database
    now = datetime.now(UTC)  # the command's clock
    planned, unplanned, kept, recent = (
        add_workflow(engine, 41, now=now),
        add_workflow(engine, 40, now=now, planned=False),
        add_workflow(engine, 40, now=now, labels={"reference": "4"}),
        add_workflow(engine, 1, now=now),
    )
    out = tmp_path / "pruned.jsonl"

    dry = run_conductor_here("traces", "prune", "--days", "30", "--dry-run")
    done = run_conductor_here(
        "traces", "prune", "--days", "30", "--export", str(out), "--batch-size", "1"
    )

    assert dry.returncode == 0, dry.stderr
    assert "2 to delete" in dry.stdout
    assert "1 kept for training" in dry.stdout
    assert "nothing was deleted" in dry.stdout
    assert done.returncode == 0, done.stderr
    assert "deleted 2 workflows (4 steps, 8 attempts) in 2 batches" in done.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["workflow_id"] for r in rows] == [str(planned), str(unplanned)]
    # The training export's fields, every one; the unplanned one without prompt or output
    assert set(rows[0]) == set(rows[1])
    assert rows[0]["prompt"][0]["role"] == "system"
    assert rows[0]["plan_valid"] is True
    assert rows[1]["prompt"] is None
    assert rows[1]["output"] is None
    assert [s["answered_by"] for s in rows[0]["steps"]] == ["alpha", "alpha"]
    assert workflow_ids(engine) == {kept, recent}


def test_the_training_export_marks_what_it_wrote_so_prune_may_delete_it(
    cli_database: Engine, tmp_path: Path
) -> None:
    engine = cli_database
    rated = add_workflow(engine, 40, feedback=1.0, now=datetime.now(UTC))

    first = run_conductor_here("traces", "prune", "--days", "30")
    unmarked = run_conductor_here(
        "traces", "export", "--out", str(tmp_path / "a.jsonl"), "--no-mark"
    )
    still = workflow_ids(engine)
    exported = run_conductor_here("traces", "export", "--out", str(tmp_path / "b.jsonl"))
    second = run_conductor_here("traces", "prune", "--days", "30", "--json")

    assert first.returncode == 0
    assert "kept 1 past retention for training" in first.stdout
    assert unmarked.returncode == 0
    assert "marked" not in unmarked.stdout
    assert still == {rated}
    assert exported.returncode == 0
    assert "marked 1 workflows exported" in exported.stdout
    outcome = json.loads(second.stdout)
    assert (outcome["deleted_workflows"], outcome["kept_for_training"]) == (1, 0)
    assert workflow_ids(engine) == set()


def test_prune_refuses_bad_input_and_deletes_nothing(
    cli_database: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = cli_database
    old = add_workflow(engine, 40, now=datetime.now(UTC))
    existing = tmp_path / "exists.jsonl"
    existing.write_text("earlier\n")

    no_policy = run_conductor_here("traces", "prune")
    both = run_conductor_here("traces", "prune", "--days", "3", "--dry-run", "--export", "x")
    overwrite = run_conductor_here("traces", "prune", "--days", "3", "--export", str(existing))
    no_dir = run_conductor_here(
        "traces", "prune", "--days", "3", "--export", str(tmp_path / "no" / "f.jsonl")
    )
    zero = run_conductor_here("traces", "prune", "--days", "0")
    huge_batch = run_conductor_here("traces", "prune", "--days", "3", "--batch-size", "100000")
    neither = run_conductor_here("traces", "retention", "set", "acme")
    bad_tenant = run_conductor_here("traces", "retention", "set", "A B", "--days", "3")
    monkeypatch.setenv("CONDUCTOR_TRACE_RETENTION_DAYS", "-1")
    get_settings.cache_clear()
    bad_setting = run_conductor_here("traces", "prune")

    assert "no retention policy" in no_policy.stderr
    assert "--dry-run deletes nothing" in both.stderr
    assert "the file exists" in overwrite.stderr
    assert existing.read_text() == "earlier\n"
    assert "no directory" in no_dir.stderr
    assert zero.returncode == 2
    assert "--days" in zero.stderr
    assert huge_batch.returncode == 2
    assert "--batch-size" in huge_batch.stderr
    assert "either --days N or --forever" in neither.stderr
    assert "tenant 'A B'" in bad_tenant.stderr
    assert "CONDUCTOR_TRACE_RETENTION_DAYS" in bad_setting.stderr
    for done in (no_policy, both, overwrite, no_dir, neither, bad_tenant, bad_setting):
        assert done.returncode != 0
    assert workflow_ids(engine) == {old}


def test_retention_commands_set_show_and_unset(cli_database: Engine) -> None:
    set_ = run_conductor_here("traces", "retention", "set", "acme", "--days", "7")
    forever = run_conductor_here("traces", "retention", "set", "keeper", "--forever")
    shown = run_conductor_here("traces", "retention", "show")
    unset = run_conductor_here("traces", "retention", "unset", "acme")
    again = run_conductor_here("traces", "retention", "unset", "acme")

    assert set_.returncode == forever.returncode == shown.returncode == unset.returncode == 0
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(x["scope"], x.get("tenant"), x["days"]) for x in lines] == [
        ("deployment", None, None),
        ("tenant", "acme", 7),
        ("tenant", "keeper", None),
    ]
    assert again.returncode != 0
    assert "no retention of its own" in again.stderr
    assert [t.tenant for t in retention.list_tenant_retention(cli_database)] == ["keeper"]


@pytest.mark.processes
def test_the_command_exits_2_with_the_reason(sqlite_url: str) -> None:
    from conductor_adapters.store.db import upgrade

    upgrade(sqlite_url)
    done = run_conductor("traces", "prune", env={"CONDUCTOR_DATABASE_URL": sqlite_url})
    assert done.returncode == 2
    assert "conductor: error: no retention policy" in done.stderr


@pytest.mark.postgres
@pytest.mark.slow
def test_a_lock_held_past_the_timeout_stops_the_prune_with_the_reason(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch in hand is rolled back and cut off the export; earlier ones stay done (2 s)."""
    engine = make_engine(postgres_url)
    monkeypatch.setenv("CONDUCTOR_DATABASE_URL", postgres_url)
    get_settings.cache_clear()
    out = tmp_path / "pruned.jsonl"
    try:
        now = datetime.now(UTC)
        first = add_workflow(engine, 50, now=now, steps=1)
        blocked = add_workflow(engine, 40, now=now, steps=1)
        with engine.connect() as holder, holder.begin():
            holder.execute(
                select(step_table.c.id).where(step_table.c.workflow_id == blocked).with_for_update()
            )
            done = run_conductor_here(
                "traces", "prune", "--days", "30", "--batch-size", "1", "--export", str(out)
            )
        assert done.returncode == 1
        assert "the prune stopped after deleting 1 workflows" in done.stderr
        assert "lock timeout" in done.stderr
        assert workflow_ids(engine) == {blocked}
        assert [json.loads(line)["workflow_id"] for line in out.read_text().splitlines()] == [
            str(first)
        ]
    finally:
        engine.dispose()
        get_settings.cache_clear()
