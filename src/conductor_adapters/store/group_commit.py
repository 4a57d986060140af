"""Group commit: the writes that arrive while one transaction commits go in the next one.

A workflow writes its trace in four or five deliveries. With one transaction each, every
delivery paid a thread hop, a commit and its fsync, and the workflow waited for each before its
next step. Here one task drains a FIFO of writes: each batch runs in one transaction in a
thread, so the workflows in flight share commits instead of queueing for them, and writes stay
in the order they were submitted. A write someone waits for starts a commit at once; one nobody
waits for (a workflow's progress) may wait a few milliseconds for company.

No library fits: SQLAlchemy has no write batching across callers, and the writes must run in
submission order with one result per write.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

logger = logging.getLogger(__name__)

Write = Callable[[Connection], None]
# Writes per transaction at most: a batch is bounded so one commit never holds a long one.
MAX_BATCH = 256
# How long a write nobody waits for may wait for others to share its commit.
LINGER_S = 0.02


class GroupCommit:
    """Submits writes; each future says whether its write was committed (failures are logged,
    never raised: a trace write that fails must not fail the workflow that made it).

    A write that someone waits for (``urgent``) starts a commit at once, taking every write
    queued before it. One that nobody waits for may linger up to ``linger_s`` for company: a
    workflow's progress then usually goes in the same commit as its next write, its outcome's
    at the latest, rather than in a commit of its own.
    """

    def __init__(
        self, engine: Engine, *, max_batch: int = MAX_BATCH, linger_s: float = LINGER_S
    ) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.linger_s = linger_s
        self._pending: deque[tuple[Write, asyncio.Future[bool]]] = deque()
        self._drain: asyncio.Task[None] | None = None
        self._lingering: asyncio.TimerHandle | None = None
        self._last: asyncio.Future[bool] | None = None

    def submit(self, write: Write, *, urgent: bool = True) -> asyncio.Future[bool]:
        """Queue ``write``; the future is done once it is committed (True) or failed (False)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        self._pending.append((write, done))
        self._last = done
        if urgent:
            self._start()
        elif self._lingering is None and not self._draining:
            self._lingering = loop.call_later(self.linger_s, self._start)
        return done

    async def flush(self) -> None:
        """Commit every write submitted so far now, and wait for them (committed or failed)."""
        if self._last is not None:
            self._start()
            await asyncio.shield(self._last)

    @property
    def _draining(self) -> bool:
        return self._drain is not None and not self._drain.done()

    def _start(self) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        if not self._draining and self._pending:
            loop = asyncio.get_running_loop()
            self._drain = loop.create_task(self._run(), name="trace-group-commit")

    async def _run(self) -> None:
        while self._pending:
            count = min(len(self._pending), self.max_batch)
            batch = [self._pending.popleft() for _ in range(count)]
            try:
                results = await asyncio.to_thread(self._commit, [write for write, _ in batch])
            except BaseException:
                # Cancelled with the loop: what was taken is lost to this process, and said so.
                for _, done in batch:
                    if not done.done():
                        done.set_result(False)
                raise
            for (_, done), committed in zip(batch, results, strict=True):
                if not done.done():
                    done.set_result(committed)

    def _commit(self, writes: list[Write]) -> list[bool]:
        try:
            with self.engine.begin() as conn:
                for write in writes:
                    write(conn)
            return [True] * len(writes)
        except (OperationalError, InterfaceError) as exc:
            # The database is unreachable or locked: one transaction per write would fail alike.
            logger.error("trace writes failed (%d lost): %s", len(writes), _reason(exc))
            return [False] * len(writes)
        except Exception as exc:
            if len(writes) == 1:
                logger.error("trace write failed: %s", _reason(exc))
                return [False]
        # One write the database refused (bad data) must not take the others with it.
        return [self._commit_one(write) for write in writes]

    def _commit_one(self, write: Write) -> bool:
        try:
            with self.engine.begin() as conn:
                write(conn)
        except Exception as exc:
            logger.error("trace write failed: %s", _reason(exc))
            return False
        return True


def _reason(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"
