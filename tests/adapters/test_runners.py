"""Embedded runners: a dead one's queued and running workflows are failed, once, with a reason;
a live one's, a finished one and a distributed one (no runner) are left alone."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, select

from conductor_adapters.store.keys import create_key, set_webhook
from conductor_adapters.store.models import (
    event_table,
    runner_table,
    webhook_delivery_table,
    workflow_table,
)
from conductor_adapters.store.runners import (
    ORPHANED,
    beat,
    fail_orphans,
    register_runner,
    unregister_runner,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _workflow(engine: Engine, status: str, runner_id: str | None) -> uuid.UUID:
    workflow_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            workflow_table.insert().values(
                id=workflow_id,
                variant="conductor-ultra",
                question="q",
                status=status,
                runner_id=runner_id,
                created_at=T0,
            )
        )
        if status == "running":
            conn.execute(
                event_table.insert().values(
                    workflow_id=workflow_id, sequence=1, kind="plan", at=T0, payload={}
                )
            )
    return workflow_id


def _status(engine: Engine, workflow_id: uuid.UUID) -> tuple[str, str | None, list[str]]:
    with engine.connect() as conn:
        status, error = conn.execute(
            select(workflow_table.c.status, workflow_table.c.error).where(
                workflow_table.c.id == workflow_id
            )
        ).one()
        kinds = conn.execute(
            select(event_table.c.kind)
            .where(event_table.c.workflow_id == workflow_id)
            .order_by(event_table.c.sequence)
        ).scalars()
        return status, error, list(kinds)


def test_a_dead_runners_workflows_are_failed_once_and_no_one_elses(engine: Engine) -> None:
    register_runner(engine, "dead", T0)
    register_runner(engine, "alive", T0)
    beat(engine, "alive", T0 + timedelta(seconds=50))
    running = _workflow(engine, "running", "dead")
    queued = _workflow(engine, "queued", "dead")
    finished = _workflow(engine, "completed", "dead")
    live = _workflow(engine, "running", "alive")
    distributed = _workflow(engine, "running", None)

    failed = fail_orphans(engine, T0 + timedelta(seconds=60), stale_after_s=30)
    again = fail_orphans(engine, T0 + timedelta(seconds=61), stale_after_s=30)

    assert sorted(failed) == sorted([running, queued])
    assert again == []
    assert _status(engine, running) == ("failed", ORPHANED, ["plan", "failed"])
    assert _status(engine, queued) == ("failed", ORPHANED, ["failed"])
    assert _status(engine, finished)[0] == "completed"
    assert _status(engine, live) == ("running", None, ["plan"])
    assert _status(engine, distributed) == ("running", None, ["plan"])
    with engine.connect() as conn:
        runners = conn.execute(select(runner_table.c.id)).scalars()
        assert list(runners) == ["alive"]  # the dead one is forgotten


def test_a_runner_taken_for_dead_registers_again_when_it_beats(engine: Engine) -> None:
    register_runner(engine, "slow", T0)
    unregister_runner(engine, "slow")

    beat(engine, "slow", T0 + timedelta(seconds=5))

    with engine.connect() as conn:
        heartbeat = conn.execute(
            select(runner_table.c.heartbeat_at).where(runner_table.c.id == "slow")
        ).scalar_one()
    assert heartbeat.replace(tzinfo=UTC) == T0 + timedelta(seconds=5)


def test_a_failed_orphan_is_delivered_to_its_webhook(engine: Engine) -> None:
    # Given a dead runner's job, submitted with a key that has a webhook URL and a secret
    key = create_key(engine, "acme").key
    set_webhook(engine, key.id, "https://hooks.example.com/conductor")
    register_runner(engine, "dead", T0)
    orphan = _workflow(engine, "running", "dead")
    with engine.begin() as conn:
        conn.execute(
            workflow_table.update().where(workflow_table.c.id == orphan).values(key_id=key.id)
        )

    # When it is failed as an orphan
    fail_orphans(engine, T0 + timedelta(seconds=60), stale_after_s=30)

    # Then its outcome waits to be delivered there, as any ended workflow's does
    with engine.connect() as conn:
        [delivery] = conn.execute(
            select(webhook_delivery_table).where(webhook_delivery_table.c.workflow_id == orphan)
        ).mappings()
    assert delivery["url"] == "https://hooks.example.com/conductor"
    assert (delivery["event_type"], delivery["status"]) == ("workflow.failed", "pending")
    assert delivery["payload"]["data"]["error"] == ORPHANED
