"""What the API needs from a runtime, and the wake-ups its readers share.

A runtime is where workflows run: embedded (the executor in this process) or distributed
(submitted through the broker; aggregators run them). It records and starts a workflow, asks
a running one to end, announces stored events to ``signals``, reports its readiness, and
lends its step runner for calls of one worker. Everything else the API does (its rules,
admission, idempotency, metrics, waiting and following) is ``conductor_api.service``'s, the
same over either runtime: both write the same trace tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import OrderedDict
from typing import Protocol

import redis.asyncio as aioredis
from sqlalchemy import Engine

from conductor.messaging import answer_stream_key
from conductor.pool import Pool
from conductor.ports import DeltaSink, StepRunner
from conductor_adapters.answer_streams import START, read_pieces
from conductor_adapters.store.runs import SubmitRequest
from conductor_api.reads import run_streams_answer

# A reader re-reads a workflow's events this often when announcements may not reach it (a
# workflow run by another process, announcements interrupted)...
POLL_INTERVAL_S = 1.0
# ...and this often when every event is announced to it: a safety net only, so the CPU a
# waiting reader costs does not grow with how long it waits.
ANNOUNCED_POLL_S = 10.0


class WorkflowElsewhere(Exception):
    """The workflow runs in another process, which this one cannot reach to cancel it."""


class WorkflowRuntime(Protocol):
    """A runtime behind the API (``EmbeddedRuntime``, ``DistributedRuntime``)."""

    mode: str  # "embedded" or "distributed", as /readyz says
    # Checks /readyz reports without failing on: a dependency every replica shares, whose
    # outage taking every API pod out of its Service would turn clear errors into refused
    # connections, and stop the job API from accepting work that waits for it.
    advisory_checks: frozenset[str]
    engine: Engine  # the trace database
    pool: Pool
    runner: StepRunner  # calls of one worker: the gateway's retries, quotas, costs
    signals: EventSignals  # where the runtime announces stored events
    # Where the text of streamed answers is read as it is written; None: answers come whole.
    answer_pieces: AnswerSource | None

    @property
    def worker_names(self) -> list[str]:
        """Workers a request may name, in pool order."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def submit(self, request: SubmitRequest) -> uuid.UUID:
        """Record the workflow (queued, with its tenant) and start it; returns at once."""
        ...

    async def request_cancel(self, workflow_id: uuid.UUID, reason: str) -> None:
        """Ask the runtime to end a running or queued workflow cancelled. Raises
        WorkflowElsewhere when this process cannot reach the one that runs it."""
        ...

    async def wait_for_run(self, workflow_id: uuid.UUID) -> bool:
        """True once a run of the workflow in this process has ended (its outcome is stored);
        False at once when it does not run here (finished, or run elsewhere)."""
        ...

    def poll_interval_s(self, workflow_id: uuid.UUID) -> float:
        """How long a reader of ``workflow_id`` waits for an announcement before re-reading."""
        ...

    async def readiness(self) -> dict[str, str]:
        """Each dependency and "ok", or what is wrong with it."""
        ...


class EventSignals:
    """Wakes the readers of a workflow's events when new ones are stored.

    Announcements are a shortcut, not the source of truth: readers re-read the table at least
    every ``WorkflowRuntime.poll_interval_s``, so a lost announcement delays an event, never
    drops it.
    """

    # Finished workflows whose last sequence is remembered: a reader that read just before the
    # final event and waits just after its announcement returns at once instead of polling.
    FINISHED_KEPT = 10_000

    def __init__(self) -> None:
        self._latest: dict[uuid.UUID, int] = {}
        self._wakeups: dict[uuid.UUID, asyncio.Event] = {}
        self._finished: OrderedDict[uuid.UUID, int] = OrderedDict()
        self.rereads = 0  # times every reader was told to re-read (announcements were missed)

    def announce(self, workflow_id: uuid.UUID, sequence: int, *, final: bool = False) -> None:
        self._latest[workflow_id] = max(sequence, self._latest.get(workflow_id, 0))
        wakeup = self._wakeups.pop(workflow_id, None)
        if wakeup is not None:
            wakeup.set()
        if final:
            self._finished[workflow_id] = self._latest.pop(workflow_id)
            while len(self._finished) > self.FINISHED_KEPT:
                self._finished.popitem(last=False)

    def latest(self, workflow_id: uuid.UUID) -> tuple[int, bool]:
        """The last sequence announced for the workflow, and whether it was its outcome."""
        if workflow_id in self._finished:
            return self._finished[workflow_id], True
        return self._latest.get(workflow_id, 0), False

    def wake_all(self) -> None:
        """Wake every waiting reader to re-read: announcements may have been missed."""
        self.rereads += 1
        wakeups, self._wakeups = self._wakeups, {}
        for wakeup in wakeups.values():
            wakeup.set()

    async def wait(self, workflow_id: uuid.UUID, after: int, timeout_s: float) -> bool:
        """Wait for an announcement past ``after``; False when ``timeout_s`` passed first."""
        latest, _ = self.latest(workflow_id)
        if latest > after:
            return True
        wakeup = self._wakeups.setdefault(workflow_id, asyncio.Event())
        try:
            await asyncio.wait_for(wakeup.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


# How long one read of a streamed answer waits for pieces. A read is never cancelled while it
# waits (a Redis read cut mid-command could leave its connection with a reply nobody reads):
# its reader looks again instead.
PIECE_WAIT_S = 0.1


class PieceReader(Protocol):
    """One client's read of a workflow's streamed answer, in order."""

    async def more(self, *, wait: bool = True) -> list[str]:
        """The pieces written since the last read, waiting up to ``PIECE_WAIT_S`` for one
        (``wait``; else not at all): empty when none came."""
        ...

    async def close(self) -> None: ...


class AnswerSource(Protocol):
    """Where the API reads the text of streamed answers as it is written."""

    def reader(self, workflow_id: uuid.UUID) -> PieceReader: ...

    async def writing(self, workflow_id: uuid.UUID) -> bool:
        """Whether the workflow asked that its answer stream and has not ended: a reader
        opened now may get pieces. (Whether its answering step does stream is the machine's
        call: with a required form, tools or a reviewed round it does not.)"""
        ...


class _Answer:
    """One workflow's streamed answer in memory: its pieces so far, its readers, whether its
    run has ended."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.readers = 0
        self.ended = False
        self.wakeup = asyncio.Event()  # set, and replaced, at each piece


class AnswerPieces:
    """The text of workflows' streamed answering steps as the embedded driver's workers write
    it (``AnswerStreams``), read by the clients that stream those answers (``AnswerSource``).

    Only workflows that asked for it (``open``, at their submission) keep pieces: from the
    first until their run has ended (``end``) and every reader then attached has closed, so a
    reader that starts late, while the workflow runs, reads them from the start, any number
    of readers each read all of them, and the pieces of a workflow nobody reads go when it
    ends.
    """

    def __init__(self) -> None:
        self._answers: dict[uuid.UUID, _Answer] = {}

    def open(self, workflow_id: uuid.UUID) -> None:
        """Keep the pieces of ``workflow_id``, which asked that its answer stream."""
        self._answers.setdefault(workflow_id, _Answer())

    def end(self, workflow_id: uuid.UUID) -> None:
        """Its run has ended: its pieces go once its readers have closed (now, if none)."""
        answer = self._answers.get(workflow_id)
        if answer is not None:
            answer.ended = True
            self._drop_if_done(workflow_id, answer)

    def sink(self, workflow_id: uuid.UUID, step: int) -> DeltaSink:
        # One answering step streams per workflow (``WorkflowMachine._streams``).
        async def add(text: str) -> None:
            answer = self._answers.get(workflow_id)
            if answer is None:  # not opened (it did not ask), or its run has ended
                return
            answer.pieces.append(text)
            answer.wakeup.set()
            answer.wakeup = asyncio.Event()

        return add

    def reader(self, workflow_id: uuid.UUID) -> PieceReader:
        return _MemoryReader(self, workflow_id, self._answers.get(workflow_id))

    async def writing(self, workflow_id: uuid.UUID) -> bool:
        answer = self._answers.get(workflow_id)
        return answer is not None and not answer.ended

    def _drop_if_done(self, workflow_id: uuid.UUID, answer: _Answer) -> None:
        if answer.ended and answer.readers == 0 and self._answers.get(workflow_id) is answer:
            del self._answers[workflow_id]


class _MemoryReader:
    def __init__(
        self, pieces: AnswerPieces, workflow_id: uuid.UUID, answer: _Answer | None
    ) -> None:
        self.pieces, self.workflow_id, self.answer, self.seen = pieces, workflow_id, answer, 0
        if answer is not None:
            answer.readers += 1

    async def more(self, *, wait: bool = True) -> list[str]:
        answer = self.answer
        if answer is None:  # nothing of it is kept: nothing ever comes
            if wait:
                await asyncio.sleep(PIECE_WAIT_S)
            return []
        if wait and len(answer.pieces) <= self.seen:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PIECE_WAIT_S):
                    await answer.wakeup.wait()
        new = answer.pieces[self.seen :]
        self.seen += len(new)
        return new

    async def close(self) -> None:
        answer, self.answer = self.answer, None
        if answer is not None:
            answer.readers -= 1
            self.pieces._drop_if_done(self.workflow_id, answer)


class RedisAnswerPieces:
    """The text of streamed answers in distributed mode: a gateway appends each piece to the
    workflow's Redis stream (``answer_stream_key``) as its worker writes it; the API process
    that holds the client's stream reads it there, as many readers as follow it. Nothing of
    it touches PostgreSQL; whether a workflow asked for it is read from its run row."""

    def __init__(self, redis: aioredis.Redis, prefix: str, engine: Engine) -> None:
        self.redis, self.prefix, self.engine = redis, prefix, engine

    def reader(self, workflow_id: uuid.UUID) -> PieceReader:
        return _RedisReader(self, answer_stream_key(self.prefix, workflow_id))

    async def writing(self, workflow_id: uuid.UUID) -> bool:
        return await asyncio.to_thread(run_streams_answer, self.engine, workflow_id)


class _RedisReader:
    def __init__(self, source: RedisAnswerPieces, key: str) -> None:
        self.source, self.key, self.last_id = source, key, START

    async def more(self, *, wait: bool = True) -> list[str]:
        wait_ms = int(PIECE_WAIT_S * 1000) if wait else None
        self.last_id, pieces = await read_pieces(self.source.redis, self.key, self.last_id, wait_ms)
        return pieces

    async def close(self) -> None:
        return None  # the stream expires (ANSWER_STREAM_TTL_S): other readers may follow it
