"""Embedded runners, and the workflows a dead one leaves behind.

The embedded runtime (``conductor serve``) runs workflows as tasks of its own process: when the
process is killed, its workflows would say "running" forever and their event streams would never
end. So each runtime registers as a runner with a heartbeat and marks the workflows it records
with its id; any runtime on the same database fails the queued or running workflows of a runner
whose heartbeat stopped, with a reason and a final ``failed`` event.

Failed rather than resumed: the calls in flight died with the process and the embedded runtime
keeps no resumable state, so resuming would mean running the workflow again from its question,
paying again for what was already done, without its client asking. A client that wants it done
submits it again; the distributed runtime is the one that resumes.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, delete, func, insert, select, update

from conductor.chat import Usage
from conductor.machine import EventKind
from conductor.workflow import (
    TERMINAL_WORKFLOW_STATUSES,
    PlanOutcome,
    StepStatus,
    WorkflowRecord,
    WorkflowStatus,
)
from conductor_adapters.store.models import event_table, runner_table, step_table, workflow_table
from conductor_adapters.webhooks import record_delivery

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
# A runner silent this long is dead: six missed beats, so a busy or paused process is not
# taken for a dead one.
STALE_AFTER_S = 30.0
ORPHANED = (
    "the server running this workflow stopped before it finished (killed or restarted); "
    "submit it again"
)
_ACTIVE = [WorkflowStatus.QUEUED.value, WorkflowStatus.RUNNING.value]


def new_runner_id() -> str:
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(4)}"


def register_runner(engine: Engine, runner_id: str, now: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(insert(runner_table).values(id=runner_id, started_at=now, heartbeat_at=now))


def beat(engine: Engine, runner_id: str, now: datetime) -> None:
    """Say the runner lives; registers it again if its row was removed (it was silent too long
    and taken for dead: its workflows were failed then, later ones are still its own)."""
    with engine.begin() as conn:
        updated = conn.execute(
            update(runner_table).where(runner_table.c.id == runner_id).values(heartbeat_at=now)
        )
        if updated.rowcount == 0:
            logger.warning("runner %s was taken for dead; registering again", runner_id)
            conn.execute(
                insert(runner_table).values(id=runner_id, started_at=now, heartbeat_at=now)
            )


def unregister_runner(engine: Engine, runner_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(delete(runner_table).where(runner_table.c.id == runner_id))


def fail_orphans(
    engine: Engine, now: datetime, stale_after_s: float = STALE_AFTER_S
) -> list[uuid.UUID]:
    """Fail the queued or running workflows of every runner silent for ``stale_after_s`` (or
    gone), and forget those runners; returns the workflows failed here."""
    cutoff = now - timedelta(seconds=stale_after_s)
    live = select(runner_table.c.id).where(runner_table.c.heartbeat_at >= cutoff)
    failed = []
    with engine.begin() as conn:
        orphans = conn.execute(
            select(workflow_table)
            .where(workflow_table.c.runner_id.is_not(None))
            .where(workflow_table.c.runner_id.not_in(live))
            .where(workflow_table.c.status.in_(_ACTIVE))
        ).mappings()
        for row in list(orphans):
            if _fail(conn, dict(row), now):
                failed.append(row["id"])
        conn.execute(delete(runner_table).where(runner_table.c.heartbeat_at < cutoff))
    if failed:
        logger.warning("failed %d workflow(s) whose server had stopped", len(failed))
    return failed


def _fail(conn: Connection, row: dict[str, Any], now: datetime) -> bool:
    """One orphan failed: its row (only if still active: another runtime may have got there
    first), its unfinished steps cancelled, a final ``failed`` event after its last one, and
    its webhook's delivery."""
    workflow_id = row["id"]
    claimed = conn.execute(
        update(workflow_table)
        .where(workflow_table.c.id == workflow_id)
        .where(workflow_table.c.status.not_in([s.value for s in TERMINAL_WORKFLOW_STATUSES]))
        .values(status=WorkflowStatus.FAILED.value, error=ORPHANED, finished_at=now)
    )
    if claimed.rowcount == 0:
        return False
    conn.execute(
        update(step_table)
        .where(step_table.c.workflow_id == workflow_id)
        .where(step_table.c.status.in_([StepStatus.PENDING.value, StepStatus.RUNNING.value]))
        .values(status=StepStatus.CANCELLED.value, error=ORPHANED, finished_at=now)
    )
    last = conn.execute(
        select(func.max(event_table.c.sequence)).where(event_table.c.workflow_id == workflow_id)
    ).scalar()
    record = _record(row, now)
    conn.execute(
        insert(event_table).values(
            workflow_id=workflow_id,
            sequence=(last or 0) + 1,
            kind=EventKind.FAILED.value,
            at=now,
            payload=record.model_dump(mode="json"),
        )
    )
    record_delivery(conn, record, now)  # its webhook is told, as of any workflow that ends
    return True


def _record(row: dict[str, Any], now: datetime) -> WorkflowRecord:
    """The failed workflow as a final event carries it: what the trace row holds (its steps
    stay in the trace, read through the API)."""
    calls = []
    for call in row["planner_calls"] or []:
        try:
            calls.append(PlanOutcome.model_validate(call))
        except ValidationError:
            continue  # written by another version: the trace row still has it
    return WorkflowRecord(
        workflow_id=row["id"],
        variant=row["variant"],
        question=row["question"],
        status=WorkflowStatus.FAILED,
        planner_calls=calls,
        steps=[],
        usage=Usage(
            prompt_tokens=row["prompt_tokens"] or 0,
            completion_tokens=row["completion_tokens"] or 0,
        ),
        cost_usd=row["cost_usd"] or 0.0,
        error=ORPHANED,
        created_at=row["created_at"],
        finished_at=now,
    )
