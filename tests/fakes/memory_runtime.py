"""A runtime in memory, for the API's rules without a server: ``WorkflowService`` over it
records each workflow in a migrated SQLite file (the reads, limits and idempotency the service
asks the trace tables for), runs nothing, and ends a workflow when the test says so
(``finish``), or at once when it was given an answer (``answer``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Engine, func, insert, select, update

from conductor.pool import Pool
from conductor.ports import StepRunner
from conductor_adapters.store.models import event_table, workflow_table
from conductor_adapters.store.runs import SubmitRequest, record_workflow
from conductor_api.runtime import ANNOUNCED_POLL_S, AnswerSource, EventSignals


class MemoryRuntime:
    """A ``WorkflowRuntime``: what was submitted and cancelled is kept in lists."""

    mode = "memory"
    advisory_checks: frozenset[str] = frozenset()

    def __init__(
        self,
        engine: Engine,
        pool: Pool,
        runner: StepRunner,
        *,
        answer: Callable[[SubmitRequest], str] | None = None,
    ) -> None:
        self.engine = engine
        self.pool = pool
        self.runner = runner
        self.signals = EventSignals()
        self.answer_pieces: AnswerSource | None = None  # answers come whole
        self.answer = answer
        self.submitted: list[SubmitRequest] = []
        self.cancelled: list[tuple[uuid.UUID, str]] = []
        self._ending: set[asyncio.Task[None]] = set()

    @property
    def worker_names(self) -> list[str]:
        return [w.name for w in self.pool.workers]

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        await asyncio.gather(*self._ending, return_exceptions=True)

    async def submit(self, request: SubmitRequest) -> uuid.UUID:
        workflow_id = uuid.uuid4()
        with self.engine.begin() as conn:
            record_workflow(conn, request, workflow_id, datetime.now(UTC))
        self.submitted.append(request)
        if self.answer is not None:
            answer = self.answer(request)
            task = asyncio.create_task(self._answer_soon(workflow_id, answer))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
        return workflow_id

    async def _answer_soon(self, workflow_id: uuid.UUID, answer: str) -> None:
        await asyncio.sleep(0)  # after the submission is answered
        self.finish(workflow_id, answer=answer)

    def finish(
        self,
        workflow_id: uuid.UUID,
        status: str = "completed",
        *,
        answer: str | None = None,
        tokens: tuple[int, int] = (0, 0),
        cost_usd: float = 0.0,
        error: str | None = None,
    ) -> None:
        """End the workflow: its row's outcome, and its final event stored and announced."""
        prompt, completion = tokens
        now = datetime.now(UTC)
        with self.engine.begin() as conn:
            conn.execute(
                update(workflow_table)
                .where(workflow_table.c.id == workflow_id)
                .values(
                    status=status,
                    answer=answer,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    total_tokens=prompt + completion,
                    cost_usd=cost_usd,
                    error=error,
                    finished_at=now,
                )
            )
            last = conn.execute(
                select(func.coalesce(func.max(event_table.c.sequence), 0)).where(
                    event_table.c.workflow_id == workflow_id
                )
            ).scalar_one()
            conn.execute(
                insert(event_table).values(
                    workflow_id=workflow_id, sequence=last + 1, kind=status, at=now, payload={}
                )
            )
        self.signals.announce(workflow_id, last + 1, final=True)

    async def request_cancel(self, workflow_id: uuid.UUID, reason: str) -> None:
        self.cancelled.append((workflow_id, reason))
        self.finish(workflow_id, "cancelled", error=reason)

    async def wait_for_run(self, workflow_id: uuid.UUID) -> bool:
        return False

    def poll_interval_s(self, workflow_id: uuid.UUID) -> float:
        return ANNOUNCED_POLL_S  # every event is announced here

    async def readiness(self) -> dict[str, str]:
        return {"database": "ok"}
