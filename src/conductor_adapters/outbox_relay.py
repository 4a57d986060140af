"""Sending what a transaction staged in the outbox, once it committed.

``send_staged`` sends staged messages in order until the broker fails. ``OutboxRelay`` does it
in a thread of its own for a process that must not wait for the broker: ``conductor api``
answers a submission once its workflow row and start message are committed, and the relay
sends the message, at once while the broker answers, and while it does not, again every few
seconds until it does. A row put less than ``FRESH_S`` ago is sent as it was put, no sweeper
being allowed to take it yet, and deleted with the process's other sent rows
(``outbox.SentRows``). An older one is claimed first (``outbox.claim``: the row is locked, and
an aggregator's sweeper skips it) and deleted in the same transaction. A message so goes out
twice only when a process dies between its send and its row's delete, or when the sweeper's
clock runs ``FRESH_S`` ahead of this one's; a start or a cancel received twice changes
nothing. Rows a relay never sent (its process stopped or died, the broker was down) are sent by
every aggregator's sweeper once ``outbox.GRACE_S`` old.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from conductor_adapters.queue import send
from conductor_adapters.store import outbox

logger = logging.getLogger(__name__)

# A relay's publish gives up quickly (one reconnect, for a connection a restart closed): the
# message waits in the outbox, not in a blocked thread, and is tried again after a pause.
QUICK_PUBLISH: dict[str, Any] = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
BATCH = 500  # rows claimed and sent in one transaction
# Rows put this recently are sent without claiming them: far within the grace before a sweeper
# may take them (the claim and the delete were a transaction per batch, most of a submission's
# database work after its own).
FRESH_S = outbox.GRACE_S / 2


def send_staged(
    app: Celery, staged: Sequence[outbox.Staged], *, retry_policy: dict[str, Any] | None = None
) -> list[int]:
    """Send ``staged`` in order until the broker fails; the ids of those sent."""
    options: dict[str, Any] = {} if retry_policy is None else {"retry_policy": retry_policy}
    done: list[int] = []
    for item in staged:
        message = item.message
        try:
            send(app, message.task, message.args, message.queue, **options)
        except (BrokerError, OSError) as exc:
            logger.warning("cannot send %s (%s); it stays in the outbox", message.task, exc)
            break
        done.append(item.id)
    return done


class OutboxRelay:
    """Sends the rows ``put`` to it in a background thread, retrying while the broker is
    down; ``put`` never blocks on the broker."""

    def __init__(self, engine: Engine, app: Celery, *, name: str = "outbox-relay") -> None:
        self._engine = engine
        self._app = app
        self._pending: list[tuple[outbox.Staged, float]] = []  # and when it was put
        self._sent_rows = outbox.SentRows(engine)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, staged: Sequence[outbox.Staged]) -> None:
        """Send these committed rows as soon as the broker takes them."""
        now = time.monotonic()
        with self._lock:
            self._pending.extend((item, now) for item in staged)
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop; rows still unsent are left to the aggregators' sweepers."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._sent_rows.close()
        if self.pending:
            logger.warning("%d staged messages left for the sweepers to send", self.pending)

    def _run(self) -> None:
        pause = 0.0
        while not self._stop.is_set():
            if pause:  # the broker or database failed: try again after a pause, not per put
                if self._stop.wait(pause):
                    return
            else:
                self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            sent = self.relay_once()
            pause = 0.0 if sent else min(RETRY_MAX_S, max(RETRY_FIRST_S, pause * 2))

    def relay_once(self) -> bool:
        """Send what is pending; False when the broker or the database failed (some remain)."""
        with self._lock:
            batch = self._pending[:BATCH]
            more = len(self._pending) > BATCH
        if not batch:
            return True
        fresh_after = time.monotonic() - FRESH_S
        fresh = [item for item, put_at in batch if put_at > fresh_after]
        sent = send_staged(self._app, fresh, retry_policy=QUICK_PUBLISH)
        self._sent_rows.add(sent)
        failed = len(sent) < len(fresh)  # the broker: the older rows wait too
        ids = [item.id for item, put_at in batch if put_at <= fresh_after]
        left = set(ids)
        if ids and not failed:
            try:
                with self._engine.begin() as conn:
                    claimed = outbox.claim(conn, ids)
                    done = send_staged(self._app, claimed, retry_policy=QUICK_PUBLISH)
                    outbox.forget(conn, done)
                    # What is still there: unsent, or being sent by a sweeper (locked).
                    left = outbox.unsent(conn, ids) if len(done) < len(ids) else set()
                failed = len(done) < len(claimed)
            except (SQLAlchemyError, OSError) as exc:
                logger.warning("cannot relay staged messages (%s); trying again", exc)
                failed = True
        gone = (set(ids) - left) | set(sent)
        with self._lock:
            self._pending = [entry for entry in self._pending if entry[0].id not in gone]
        if more:
            self._wake.set()  # the next batch at once
        return not failed
