"""The transactional outbox: queue messages sent only once committed.

A transaction that advances a workflow stores the messages it calls for (``stage``) beside the
state; after the commit the aggregator sends them and deletes their rows (``sent``). The API
stages a submission's start (and a cancel) the same way, and its relay sends them in the
background (conductor_adapters.outbox_relay), so a client never waits for the broker. A message
is therefore never out before the state that sent it, so a failed or killed transaction sends
nothing; and an aggregator that dies between its commit and its sends leaves the rows, which
the sweeper sends once they are ``GRACE_S`` old (``take_stale``). That late send may repeat one
that did go out just before a death: gateways recognise a step's repeated call (its step key)
and do not call the provider for it twice.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from conductor_adapters.periodic import Periodic
from conductor_adapters.store.models import outbox_table

logger = logging.getLogger(__name__)

# How long a staged message may wait for its own aggregator's send before the sweeper sends it:
# well above a send's usual milliseconds, well below a step's deadline.
GRACE_S = 10.0
# How often a process deletes the rows of the messages it sent since (``SentRows``).
FORGET_INTERVAL_S = 0.2


@dataclass(frozen=True)
class Message:
    task: str
    queue: str
    args: list[Any]


@dataclass(frozen=True)
class Staged:
    id: int
    message: Message


def stage(
    conn: Connection, workflow_id: uuid.UUID, messages: Sequence[Message], now: datetime
) -> list[Staged]:
    """Store ``messages`` in the caller's transaction; they go out after it commits."""
    if not messages:
        return []
    rows = [
        {
            "workflow_id": workflow_id,
            "task": m.task,
            "queue": m.queue,
            "args": m.args,
            "created_at": now,
        }
        for m in messages
    ]
    ids = list(conn.execute(_STAGE, rows).scalars())
    return [Staged(i, m) for i, m in zip(ids, messages, strict=True)]


# Built once, its compiled form cached: a statement with the rows in its VALUES was compiled
# again for every transaction that staged. One round trip for any number of rows (SQLAlchemy's
# insertmanyvalues), the ids in the rows' order.
_STAGE = insert(outbox_table).returning(outbox_table.c.id, sort_by_parameter_order=True)


def sent(engine: Engine, ids: Sequence[int]) -> None:
    """Forget messages that went out."""
    if ids:
        with engine.begin() as conn:
            forget(conn, ids)


class SentRows:
    """The rows of messages that went out, deleted together by a thread of their own every
    ``FORGET_INTERVAL_S``: one statement for a process's sends of that time, where a
    transaction per send cost an aggregator a connection checkout, a ping and three round
    trips for each message. A row lives that much longer; one whose process dies first is sent
    again by a sweeper after ``GRACE_S``, which changes nothing (as for a death between a send
    and its delete: gateways know a step's repeated call, a round planned or a workflow started
    ignores its repeat)."""

    def __init__(self, engine: Engine, interval_s: float = FORGET_INTERVAL_S) -> None:
        self._engine = engine
        self._ids: list[int] = []
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._thread = Periodic("conductor-outbox-forget", self.flush, interval_s).start()

    def add(self, ids: Sequence[int]) -> None:
        if ids:
            with self._lock:
                self._ids.extend(ids)

    def flush(self) -> int:
        """Delete the rows added so far; how many were deleted. A delete that fails forgets
        its rows rather than growing a backlog while the database is away: the sweepers send
        their messages again, which changes nothing."""
        with self._flushing:  # one at a time: a flush returns once what it saw is deleted
            with self._lock:
                ids, self._ids = self._ids, []
            if not ids:
                return 0
            try:
                sent(self._engine, ids)
            except SQLAlchemyError as exc:
                logger.warning("cannot delete %d rows of sent messages (%s)", len(ids), exc)
                return 0
            return len(ids)

    def close(self) -> None:
        """Stop the thread and delete what is left."""
        self._thread.stop()
        self.flush()


def take_stale(conn: Connection, now: datetime, limit: int = 200) -> list[Staged]:
    """Messages staged over ``GRACE_S`` ago and still unsent, locked for this transaction
    (another sweeper skips them); the caller sends them, then deletes them with ``forget``."""
    query = (
        select(outbox_table.c.id, outbox_table.c.task, outbox_table.c.queue, outbox_table.c.args)
        .where(outbox_table.c.created_at <= now - timedelta(seconds=GRACE_S))
        .order_by(outbox_table.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [
        Staged(row.id, Message(row.task, row.queue, list(row.args))) for row in conn.execute(query)
    ]


def claim(conn: Connection, ids: Sequence[int]) -> list[Staged]:
    """Those of ``ids`` still unsent and not being sent by another transaction (a sweeper),
    locked for this one, in their order; the caller sends them, then ``forget``s them."""
    if not ids:
        return []
    query = (
        select(outbox_table.c.id, outbox_table.c.task, outbox_table.c.queue, outbox_table.c.args)
        .where(outbox_table.c.id.in_(list(ids)))
        .order_by(outbox_table.c.id)
        .with_for_update(skip_locked=True)
    )
    return [
        Staged(row.id, Message(row.task, row.queue, list(row.args))) for row in conn.execute(query)
    ]


def unsent(conn: Connection, ids: Sequence[int]) -> set[int]:
    """Those of ``ids`` whose rows are still there (unsent, or being sent right now)."""
    if not ids:
        return set()
    query = select(outbox_table.c.id).where(outbox_table.c.id.in_(list(ids)))
    return set(conn.execute(query).scalars())


def forget(conn: Connection, ids: Sequence[int]) -> None:
    if ids:
        conn.execute(delete(outbox_table).where(outbox_table.c.id.in_(list(ids))))
