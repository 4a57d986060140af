"""Waiting for a workflow's answer on behalf of a client (Chat Completions, Responses,
completions): the answer once it has come, or the progress of a stream until it comes; a
workflow whose client goes away first is cancelled, its answer having nobody else to go to
(a job submitted to the job API runs on)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from conductor_api.errors import ApiError
from conductor_api.openai_shared import workflow_failed, workflow_timed_out
from conductor_api.schemas import WorkflowView
from conductor_api.service import WorkflowService
from conductor_api.sse import KEEPALIVE, with_keepalive

CLIENT_GONE = "its client went away before the answer"
DISCONNECT_POLL_S = 0.5
# Cancels started for streams whose client went away, kept until they end (a task nobody
# holds can be collected before it runs).
_cancelling: set[asyncio.Task[None]] = set()


def disconnected(request: Request) -> Callable[[], Awaitable[None]]:
    """What returns once the client of ``request`` has closed its connection. Polled:
    Starlette tells of a disconnect only when asked."""

    async def gone() -> None:
        while not await request.is_disconnected():  # noqa: ASYNC110
            await asyncio.sleep(DISCONNECT_POLL_S)

    return gone


async def completed_workflow(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    tenant: str,
    timeout_s: float,
    gone: Callable[[], Awaitable[None]],
) -> WorkflowView:
    """The workflow once it has completed (counted in the metrics); a 502 if it did not, a
    504 past ``timeout_s`` (the workflow runs on). If the client goes away first (``gone``
    returns), the workflow is cancelled."""
    outcome = asyncio.ensure_future(service.wait_for_outcome(workflow_id, tenant))
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
    SSE comments (OpenAI clients skip them, curl shows them). Raises a 504 ApiError past
    ``timeout_s`` (the workflow runs on). Closed before the workflow finishes (the client went
    away, so the server closes the stream) or broken, it cancels the workflow: its answer has
    nobody else to go to. Close it explicitly (``contextlib.aclosing``) so that the cancel
    does not wait for garbage collection. Then ``service.ended`` reads the outcome."""
    finished = False
    try:
        for line in first:
            yield line
        async with asyncio.timeout(timeout_s):
            async for event in with_keepalive(service.follow(workflow_id, tenant)):
                yield KEEPALIVE if event is None else f": {event.kind} {event.sequence}\n\n"
        finished = True
    except TimeoutError:
        finished = True
        raise workflow_timed_out(workflow_id, timeout_s) from None
    finally:
        if not finished:
            _cancel_in_background(service, workflow_id, tenant)


@dataclass(frozen=True)
class AnswerText:
    """A piece of the answer's text, as the answering step's worker wrote it."""

    text: str


async def with_answer_text(
    service: WorkflowService,
    workflow_id: uuid.UUID,
    progress: AsyncGenerator[str, None],
    opening: int,
) -> AsyncGenerator[str | AnswerText, None]:
    """A workflow's stream (``workflow_progress``) with the text of its streamed answering
    step put in as it is written, after the stream's ``opening`` lines (its start, which a
    client reads first): every piece is out before the stream ends (the step's text is all
    written before the step, and so the workflow, is recorded as ended). Where the runtime
    streams no answers, the stream as it is."""
    source = service.runtime.answer_pieces
    if source is None:
        async for line in progress:
            yield line
        return
    reader = source.reader(workflow_id)
    next_line: asyncio.Future[str] = asyncio.ensure_future(anext(progress))
    more: asyncio.Future[list[str]] | None = None
    held: list[str] = []  # pieces read before the opening lines went out
    try:
        while True:
            if more is None:
                more = asyncio.ensure_future(reader.more())
            waiting: set[asyncio.Future[Any]] = {next_line, more}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if more.done():
                held += more.result()
                more = None
            if next_line.done():
                try:
                    line = next_line.result()
                except StopAsyncIteration:
                    break
                yield line
                opening -= 1
                next_line = asyncio.ensure_future(anext(progress))
            if opening <= 0:
                for text in held:
                    yield AnswerText(text)
                held = []
        # The workflow has ended: its step wrote every piece before that, so the read under
        # way and one more find the rest (a read is let finish, never cancelled).
        if more is not None:
            held += await more
            more = None
        held += await reader.more()
        for text in held:
            yield AnswerText(text)
    finally:
        next_line.cancel()
        if more is not None:
            with contextlib.suppress(Exception):
                await more
        await reader.close()
        await progress.aclose()
