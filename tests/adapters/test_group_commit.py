"""Group commit: writes share transactions under load, keep their order, fail alone."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, event, text

from conductor_adapters.store.db import make_engine
from conductor_adapters.store.group_commit import GroupCommit, Write

COMMITS: dict[Engine, int] = {}


@pytest.fixture
def notes(tmp_path: Path) -> Iterator[Engine]:
    """A SQLite database with one table of numbered notes, counting its commits in COMMITS."""
    engine = make_engine(f"sqlite:///{tmp_path / 'notes.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE note (n INTEGER NOT NULL)"))
    COMMITS[engine] = 0

    def count(_: Connection) -> None:
        COMMITS[engine] += 1

    event.listen(engine, "commit", count)
    yield engine
    del COMMITS[engine]
    engine.dispose()


def note(n: int | None) -> Write:
    def write(conn: Connection) -> None:
        conn.execute(text("INSERT INTO note (n) VALUES (:n)"), {"n": n})

    return write


def stored(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return [row[0] for row in conn.execute(text("SELECT n FROM note ORDER BY rowid"))]


async def test_writes_arriving_during_a_commit_share_the_next_one_in_order(notes: Engine) -> None:
    # Given a first write whose commit is held until 99 more writes have arrived
    commits = GroupCommit(notes)
    release = threading.Event()

    def slow_first(conn: Connection) -> None:
        release.wait(10)
        note(0)(conn)

    first = commits.submit(slow_first)
    await asyncio.sleep(0.05)  # its commit has begun
    rest = [commits.submit(note(n)) for n in range(1, 100)]
    release.set()
    # When they are all done
    results = await asyncio.gather(first, *rest)
    # Then every one was committed, in the order submitted, in two transactions, not 100
    assert all(results)
    assert stored(notes) == list(range(100))
    assert COMMITS[notes] == 2


async def test_a_batch_is_bounded(notes: Engine) -> None:
    commits = GroupCommit(notes, max_batch=10)
    results = await asyncio.gather(*(commits.submit(note(n)) for n in range(35)))
    assert all(results)
    assert stored(notes) == list(range(35))
    assert COMMITS[notes] == 4


async def test_a_write_the_database_refuses_loses_only_itself(
    notes: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a batch in which one write breaks a NOT NULL constraint
    commits = GroupCommit(notes)
    writes = [note(1), note(None), note(3)]
    # When it is committed
    with caplog.at_level(logging.ERROR):
        results = await asyncio.gather(*(commits.submit(w) for w in writes))
    # Then the other two are kept, and the refused one is reported, not raised
    assert results == [True, False, True]
    assert stored(notes) == [1, 3]
    assert "trace write failed: IntegrityError" in caplog.text


async def test_an_unreachable_database_fails_the_batch_without_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a database file that cannot be opened (its path is a directory)
    (tmp_path / "dir.db").mkdir()
    engine = make_engine(f"sqlite:///{tmp_path / 'dir.db'}")
    commits = GroupCommit(engine)
    # When writes are submitted
    with caplog.at_level(logging.ERROR):
        results = await asyncio.gather(*(commits.submit(note(n)) for n in range(3)))
    # Then each says it was not stored, and the log says why, once
    assert results == [False, False, False]
    assert caplog.text.count("trace writes failed (0 held for a retry, 3 lost): Operational") == 1
    assert commits.failing is not None
    assert "unable to open database file" in commits.failing
    engine.dispose()


async def test_writes_kept_are_committed_once_the_database_takes_writes_again(
    tmp_path: Path,
) -> None:
    """A full disk, a lock, a lost connection: the outcome of a workflow (kept) is committed
    when the database is back, not lost with the submitter's False (issue 36 #10)."""
    # Given a database that cannot take writes for now (a directory where its file goes)
    blocked = tmp_path / "later.db"
    blocked.mkdir()
    engine = make_engine(f"sqlite:///{blocked}")
    commits = GroupCommit(engine)
    commits.retry_held_s = 0.05
    # When a write to keep and one not to keep fail
    kept, lost = await asyncio.gather(commits.submit(note(1), keep=True), commits.submit(note(2)))
    # Then both say so, the kept one is held, and the store says why writes fail
    assert (kept, lost) == (False, False)
    assert commits.held == 1
    assert commits.failing is not None
    # And once the database takes writes again, the kept one is committed by itself
    blocked.rmdir()
    engine.dispose()
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE note (n INTEGER)"))
    for _ in range(500):  # 10 s at most
        # (a retry in flight has taken its writes off the held list before it commits)
        if not commits.held and commits.failing is None:
            break
        await asyncio.sleep(0.02)
    assert commits.held == 0
    assert commits.failing is None
    with engine.connect() as conn:
        assert conn.execute(text("SELECT n FROM note")).scalars().all() == [1]
    engine.dispose()


async def test_flush_waits_for_every_write_submitted(notes: Engine) -> None:
    commits = GroupCommit(notes)
    for n in range(20):
        commits.submit(note(n))
    await commits.flush()
    assert stored(notes) == list(range(20))


async def test_writes_nobody_waits_for_share_the_commit_of_the_next_awaited_one(
    notes: Engine,
) -> None:
    # Given a workflow's progress (nobody waits for it) queued over a few milliseconds
    commits = GroupCommit(notes, linger_s=1.0)
    progress = [commits.submit(note(n), urgent=False) for n in range(3)]
    await asyncio.sleep(0.05)
    assert not any(p.done() for p in progress)  # lingering for company
    # When its outcome, which the workflow waits for, is queued
    assert await commits.submit(note(3))
    # Then all four went in one commit, in order
    assert all(p.result() for p in progress)
    assert stored(notes) == [0, 1, 2, 3]
    assert COMMITS[notes] == 1


async def test_a_write_nobody_waits_for_is_committed_within_the_linger(notes: Engine) -> None:
    commits = GroupCommit(notes, linger_s=0.05)
    alone = commits.submit(note(7), urgent=False)
    assert await asyncio.wait_for(alone, 2)
    assert stored(notes) == [7]
