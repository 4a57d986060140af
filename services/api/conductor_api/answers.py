"""Waiting for a workflow's answer on behalf of a client (Chat Completions, Responses,
completions): the answer once it has come, or the progress of a stream until it comes; a
workflow whose client goes away first is cancelled, its answer having nobody else to go to
(a job submitted to the job API runs on). And a streamed answer's text as it is written, put
into those streams and into the job API's and gRPC's event streams."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request

from conductor.machine import FINAL_EVENT_KINDS
from conductor_api.errors import ApiError
from conductor_api.openai_shared import workflow_failed, workflow_timed_out
from conductor_api.runtime import AnswerSource, PieceReader
from conductor_api.schemas import EventView, WorkflowView
from conductor_api.service import WorkflowService
from conductor_api.sse import KEEPALIVE, with_keepalive

T = TypeVar("T")

CLIENT_GONE = "its client went away before the answer"
# Cancels started for streams whose client went away, kept until they end (a task nobody
# holds can be collected before it runs).
_cancelling: set[asyncio.Task[None]] = set()


def disconnected(request: Request) -> Callable[[], Awaitable[None]]:
    """What returns once the client of ``request`` has closed its connection. The request's
    body has been read: the server's next message for it is the disconnect, so waiting for it
    costs nothing meanwhile (polling ``is_disconnected`` twice a second cost a request waiting
    on a workflow more CPU the longer it waited)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass  # a body part left unread: the disconnect comes after it

    return gone


async def completed_workflow(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    tenant: str,
    timeout_s: float,
    gone: Callable[[], Awaitable[None]],
    *,
    submitted_now: bool = False,
) -> WorkflowView:
    """The workflow once it has completed (counted in the metrics); a 502 if it did not, a
    504 past ``timeout_s`` (the workflow runs on). If the client goes away first (``gone``
    returns), the workflow is cancelled. ``submitted_now``: by this request, a moment ago."""
    waiting = service.wait_for_outcome(workflow_id, tenant, submitted_now=submitted_now)
    outcome = asyncio.ensure_future(waiting)
    left = asyncio.ensure_future(gone())
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait({outcome, left}, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        raise workflow_timed_out(workflow_id, timeout_s) from None
    finally:
        left.cancel()
        if not outcome.done():
            outcome.cancel()
    if not outcome.done() or outcome.cancelled():
        await service.cancel(workflow_id, tenant, CLIENT_GONE)
    else:
        outcome.result()  # raises what the wait raised
    view = await service.ended(workflow_id, tenant)
    if view is None:  # deleted meanwhile
        raise ApiError(404, f"workflow {workflow_id} not found", code="not_found")
    if view.status != "completed":
        raise workflow_failed(view)
    return view


def _cancel_in_background(service: WorkflowService, workflow_id: uuid.UUID, tenant: str) -> None:
    """Cancel from a stream the server is tearing down: in a task of its own, outside the
    stream's cancelled scope."""
    task = asyncio.get_running_loop().create_task(service.cancel(workflow_id, tenant, CLIENT_GONE))
    _cancelling.add(task)
    task.add_done_callback(_cancelling.discard)


async def workflow_progress(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    tenant: str,
    timeout_s: float,
    first: Iterable[str],
) -> AsyncGenerator[str, None]:
    """A workflow's stream until it finishes: ``first``, then keepalives and its progress as
    SSE comments (OpenAI clients skip them, curl shows them); ``workflow_events`` otherwise."""
    events = workflow_events(service, workflow_id, tenant, timeout_s, first)
    async with contextlib.aclosing(events) as items:
        async for item in items:
            yield item if isinstance(item, str) else progress_comment(item)


def progress_comment(event: EventView) -> str:
    """A workflow's event as an SSE comment: ``: plan 1``."""
    return f": {event.kind} {event.sequence}\n\n"


async def workflow_events(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    tenant: str,
    timeout_s: float,
    first: Iterable[str],
) -> AsyncGenerator[str | EventView, None]:
    """A workflow's stream until it finishes: ``first``, then keepalives and its stored
    events, for the stream to render. Raises a 504 ApiError past ``timeout_s`` (the workflow
    runs on). Closed before the workflow finishes (the client went away, so the server closes
    the stream) or broken, it cancels the workflow: its answer has nobody else to go to. Close
    it explicitly (``contextlib.aclosing``) so that the cancel does not wait for garbage
    collection. Then ``service.ended`` reads the outcome."""
    finished = False
    try:
        for line in first:
            yield line
        async with asyncio.timeout(timeout_s):
            async for event in with_keepalive(service.follow(workflow_id, tenant)):
                yield KEEPALIVE if event is None else event
        finished = True
    except TimeoutError:
        finished = True
        raise workflow_timed_out(workflow_id, timeout_s) from None
    finally:
        if not finished:
            _cancel_in_background(service, workflow_id, tenant)


@dataclass(frozen=True)
class AnswerText:
    """A piece of the answer's text, as the answering step's worker wrote it; ``offset``: the
    number of characters of the answer before it."""

    text: str
    offset: int = 0


async def with_answer_text(
    source: AnswerSource | None,
    workflow_id: uuid.UUID,
    progress: AsyncGenerator[T, None],
    opening: int = 0,
    *,
    last: Callable[[T], bool] | None = None,
) -> AsyncGenerator[T | AnswerText, None]:
    """A workflow's stream (``workflow_progress``'s lines, ``follow``'s events) with the text
    of its streamed answering step put in as it is written (read from ``source``; None: the
    stream as it is), after the stream's ``opening`` items (its start, which a client reads
    first). Every piece is out before the item that ``last`` tells is the outcome, else
    before the stream ends: the step's text is all written before the step, and so the
    workflow, is recorded as ended."""
    if source is None:
        async for item in progress:
            yield item
        return
    reader = source.reader(workflow_id)
    next_item: asyncio.Future[T] = asyncio.ensure_future(anext(progress))
    more: asyncio.Future[list[str]] | None = None
    held: list[str] = []  # pieces read and not yet out
    offset = 0  # characters of the answer out so far
    reading = True  # until the outcome is out

    def out() -> list[AnswerText]:
        """The pieces held, as the answer's next pieces."""
        nonlocal held, offset
        pieces = []
        for text in held:
            pieces.append(AnswerText(text, offset))
            offset += len(text)
        held = []
        return pieces

    try:
        while True:
            if more is None and reading:
                more = asyncio.ensure_future(reader.more())
            waiting: set[asyncio.Future[Any]] = {next_item} if more is None else {next_item, more}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if more is not None and more.done():
                held += more.result()
                more = None
            if next_item.done():
                try:
                    item = next_item.result()
                except StopAsyncIteration:
                    break
                if reading and last is not None and last(item):
                    # The outcome: every piece was written before it, so the read under way
                    # and one more find the rest (a read is let finish, never cancelled).
                    held += await _rest(reader, more)
                    more, reading, opening = None, False, 0
                    for piece in out():
                        yield piece
                yield item
                opening -= 1
                next_item = asyncio.ensure_future(anext(progress))
            if opening <= 0:
                for piece in out():
                    yield piece
        if reading:  # the workflow has ended: as for the outcome above
            held += await _rest(reader, more)
            more = None
        for piece in out():
            yield piece
    finally:
        next_item.cancel()
        if more is not None:
            with contextlib.suppress(Exception):
                await more
        await reader.close()
        await progress.aclose()


async def _rest(reader: PieceReader, under_way: asyncio.Future[list[str]] | None) -> list[str]:
    """The pieces not read yet of an answer written whole: the read under way, then one more
    that does not wait."""
    pieces = [] if under_way is None else await under_way
    return pieces + await reader.more(wait=False)


async def follow_with_answer(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    tenant: str,
    after: int,
    *,
    keepalive: bool = False,
) -> AsyncGenerator[EventView | AnswerText | None, None]:
    """The workflow's stored events past ``after`` (``service.follow``) and, where it asked
    that its answer stream and is still running, that answer's text (``AnswerText``) as it is
    written, all of it before the outcome; from the answer's start on every call, a resume
    included (``offset`` lets a client skip what it has). With ``keepalive``, None whenever
    ``KEEPALIVE_S`` passes without an event. Raises LookupError at once when the workflow is
    not the tenant's."""
    events: AsyncGenerator[EventView, None] = service.follow(workflow_id, tenant, after)
    progress: AsyncGenerator[EventView | None, None] = (
        with_keepalive(events) if keepalive else events
    )
    source = service.runtime.answer_pieces
    if source is not None and not await source.writing(workflow_id):
        source = None
    merged = with_answer_text(source, workflow_id, progress, last=_is_outcome)
    async with contextlib.aclosing(merged) as items:
        async for item in items:
            yield item


def _is_outcome(event: EventView | None) -> bool:
    return event is not None and event.kind in FINAL_EVENT_KINDS
