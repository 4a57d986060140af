"""Group commit: the writes that arrive while one transaction commits go in the next one.

A workflow writes its trace in four or five deliveries. With one transaction each, every
delivery paid a thread hop, a commit and its fsync, and the workflow waited for each before its
next step. Here one task drains a FIFO of writes: each batch runs in one transaction in a
thread, so the workflows in flight share commits instead of queueing for them, and writes stay
in the order they were submitted. A write someone waits for starts a commit at once; one nobody
waits for (a workflow's progress) may wait a few milliseconds for company.

No library fits: SQLAlchemy has no write batching across callers, and the writes must run in
submission order with one result per write.

When the database cannot take writes for a while (a full disk, a lock, a lost connection), a
write submitted with ``keep`` (a workflow's progress and outcome) is held and committed again,
ahead of newer writes, once the database takes writes again: its submitter heard False, but
the trace is not left saying "running" about a workflow that ended. ``failing`` says why the
last commit failed, until one succeeds (readiness reports it: reads may work while every write
fails).
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
# Held writes (see the module) are tried again this often while nothing else is committed, and
# at most this many are held: past it the oldest is dropped, and its loss logged.
RETRY_HELD_S = 1.0
MAX_HELD = 10_000


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
        self.retry_held_s = RETRY_HELD_S
        self._pending: deque[tuple[Write, asyncio.Future[bool]]] = deque()
        self._drain: asyncio.Task[None] | None = None
        self._lingering: asyncio.TimerHandle | None = None
        self._last: asyncio.Future[bool] | None = None
        self._keep: set[Write] = set()  # writes held when the database cannot take them
        self._held: deque[Write] = deque()
        self._retrying: asyncio.TimerHandle | None = None
        self.failing: str | None = None  # why the last commit failed; None once one succeeds

    @property
    def held(self) -> int:
        """Writes waiting for the database to take writes again."""
        return len(self._held)

    def submit(
        self, write: Write, *, urgent: bool = True, keep: bool = False
    ) -> asyncio.Future[bool]:
        """Queue ``write``; the future is done once it is committed (True) or failed (False).
        ``keep``: held and committed later if it failed for want of a writable database."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        if keep:
            self._keep.add(write)
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
        while self._pending or self._held:
            # Held writes first, in their order: newer writes of their workflows follow them.
            held = [self._held.popleft() for _ in range(min(len(self._held), self.max_batch))]
            count = min(len(self._pending), self.max_batch - len(held))
            batch = [self._pending.popleft() for _ in range(count)]
            writes = [*held, *(write for write, _ in batch)]
            try:
                results, unavailable = await asyncio.to_thread(self._commit, writes)
            except BaseException:
                # Cancelled with the loop: what was taken is lost to this process, and said so.
                for _, done in batch:
                    if not done.done():
                        done.set_result(False)
                raise
            if unavailable:
                self._hold([w for w in writes if w in self._keep or w in held])
            else:
                self._keep.difference_update(writes)
            for (_, done), committed in zip(batch, results[len(held) :], strict=True):
                if not done.done():
                    done.set_result(committed)
            if unavailable:
                break  # the rest waits for the retry, rather than fail alike at once
        if self._held and self._retrying is None:
            loop = asyncio.get_running_loop()
            self._retrying = loop.call_later(self.retry_held_s, self._retry_held)

    def _hold(self, writes: list[Write]) -> None:
        self._held.extend(writes)
        while len(self._held) > MAX_HELD:
            self._keep.discard(self._held.popleft())
            logger.error("a held trace write was dropped: over %d held", MAX_HELD)

    def _retry_held(self) -> None:
        self._retrying = None
        if not self._draining:
            self._drain = asyncio.get_running_loop().create_task(
                self._run(), name="trace-group-commit"
            )

    def _commit(self, writes: list[Write]) -> tuple[list[bool], bool]:
        """Whether each write committed, and whether the database could take no write."""
        try:
            with self.engine.begin() as conn:
                for write in writes:
                    write(conn)
            self.failing = None
            return [True] * len(writes), False
        except (OperationalError, InterfaceError) as exc:
            # The database is unreachable, locked or full: one transaction per write would fail
            # alike. Writes to keep are held for later (see the module).
            self.failing = _reason(exc)
            kept = sum(w in self._keep for w in writes)
            logger.error(
                "trace writes failed (%d held for a retry, %d lost): %s",
                kept,
                len(writes) - kept,
                self.failing,
            )
            return [False] * len(writes), True
        except Exception as exc:
            if len(writes) == 1:
                logger.error("trace write failed: %s", _reason(exc))
                return [False], False
        # One write the database refused (bad data) must not take the others with it.
        return [self._commit_one(write) for write in writes], False

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
