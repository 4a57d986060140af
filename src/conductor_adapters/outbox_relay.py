"""Sending what a transaction staged in the outbox, once it committed.

``send_staged`` sends staged messages in order until the broker fails. ``OutboxRelay`` does it
in a thread of its own for a process that must not wait for the broker: ``conductor api``
answers a submission once its workflow row and start message are committed, and the relay
sends the message, at once while the broker answers, and while it does not, again every few
seconds until it does. Each send claims its row first (``outbox.claim``: the row is locked,
and an aggregator's sweeper skips it), and the row is deleted in the same transaction, so a
message goes out twice only when a process dies between its send and that commit; a start or
a cancel received twice changes nothing. Rows a relay never sent (its process stopped or died,
the broker was down) are sent by every aggregator's sweeper once ``outbox.GRACE_S`` old.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

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


def send_staged(
    app: Celery, staged: Sequence[outbox.Staged], *, retry_policy: dict[str, Any] | None = None
) -> list[int]:
    """Send ``staged`` in order until the broker fails; the ids of those sent."""
    options: dict[str, Any] = {} if retry_policy is None else {"retry_policy": retry_policy}
    done: list[int] = []
    for item in staged:
        message = item.message
        try:
            app.send_task(message.task, args=message.args, queue=message.queue, **options)
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
        self._pending: list[int] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, staged: Sequence[outbox.Staged]) -> None:
        """Send these committed rows as soon as the broker takes them."""
        with self._lock:
            self._pending.extend(item.id for item in staged)
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
            ids = self._pending[:BATCH]
            more = len(self._pending) > BATCH
        if not ids:
            return True
        try:
            with self._engine.begin() as conn:
                claimed = outbox.claim(conn, ids)
                done = send_staged(self._app, claimed, retry_policy=QUICK_PUBLISH)
                outbox.forget(conn, done)
                # What is still there: unsent, or being sent by a sweeper (locked).
                left = outbox.unsent(conn, ids) if len(done) < len(ids) else set()
        except (SQLAlchemyError, OSError) as exc:
            logger.warning("cannot relay staged messages (%s); trying again", exc)
            return False
        taken = set(ids)
        with self._lock:
            self._pending = [i for i in self._pending if i in left or i not in taken]
        if more:
            self._wake.set()  # the next batch at once
        return len(done) == len(claimed)
