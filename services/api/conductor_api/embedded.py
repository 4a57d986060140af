"""The embedded runtime behind the API: workflows run as tasks of this process's event loop."""

from __future__ import annotations

import asyncio
import logging
import uuid

import httpx
from sqlalchemy import Connection, text

from conductor.errors import ConfigurationError, DatabaseUnavailableError
from conductor.executor import WorkflowExecutor
from conductor.machine import Cancelled, utcnow
from conductor.pool import Pool
from conductor.ports import StepRunner
from conductor.workflow import WorkflowRecord
from conductor_adapters.store.runners import (
    HEARTBEAT_S,
    STALE_AFTER_S,
    beat,
    fail_orphans,
    new_runner_id,
    register_runner,
    unregister_runner,
)
from conductor_adapters.store.runs import SubmitRequest, record_workflow
from conductor_adapters.store.traces import TraceStore
from conductor_adapters.webhooks import attempt, claim_due
from conductor_api.runtime import (
    ANNOUNCED_POLL_S,
    POLL_INTERVAL_S,
    AnswerPieces,
    AnswerSource,
    EventSignals,
    WorkflowElsewhere,
)

logger = logging.getLogger(__name__)
WEBHOOK_POLL_S = 0.5  # how soon an outcome's webhook goes out


class EmbeddedRuntime:
    """A ``WorkflowRuntime``: the executor runs each workflow in this process, writing to
    ``store``; the gateway makes the calls of one worker."""

    mode = "embedded"
    advisory_checks: frozenset[str] = frozenset()

    def __init__(
        self,
        executor: WorkflowExecutor,
        gateway: StepRunner,
        store: TraceStore,
        pool: Pool,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        if store not in executor.observers:
            raise ConfigurationError("the executor does not write to this trace store")
        self.engine = store.engine
        self.pool = pool
        self.signals = EventSignals()
        # The executor runs here, so the text of a streamed answer goes straight to its client.
        self.pieces = AnswerPieces()
        executor.answer_streams = self.pieces
        self.answer_pieces: AnswerSource | None = self.pieces
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.executor = executor
        self.runner = gateway
        self.store = store
        # Events are announced once committed, so what a woken reader reads is there.
        store.on_stored.append(
            lambda workflow_id, last, final: self.signals.announce(workflow_id, last, final=final)
        )
        # Workflows running here, by id: their events are announced here.
        self._running: dict[uuid.UUID, asyncio.Task[WorkflowRecord]] = {}
        self.runner_id = new_runner_id()
        self._heartbeat: asyncio.Task[None] | None = None
        self._webhooks: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register as a runner, fail what dead runners left running, and beat from now on."""
        await asyncio.to_thread(register_runner, self.engine, self.runner_id, utcnow())
        await asyncio.to_thread(fail_orphans, self.engine, utcnow(), self.stale_after_s)
        self._heartbeat = asyncio.create_task(self._beat(), name="runner-heartbeat")
        self._webhooks = asyncio.create_task(self._deliver_webhooks(), name="webhooks")

    async def _deliver_webhooks(self) -> None:
        """Deliver the webhooks that are due, every ``WEBHOOK_POLL_S``, one at a time."""
        with httpx.Client(follow_redirects=False) as client:
            while True:
                try:
                    for delivery_id in await asyncio.to_thread(claim_due, self.engine):
                        await asyncio.to_thread(attempt, self.engine, delivery_id, client)
                except Exception as exc:  # the database is down: try again later
                    logger.warning("webhook delivery: %s: %s", type(exc).__name__, exc)
                await asyncio.sleep(WEBHOOK_POLL_S)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await asyncio.to_thread(beat, self.engine, self.runner_id, utcnow())
                await asyncio.to_thread(fail_orphans, self.engine, utcnow(), self.stale_after_s)
            except Exception as exc:  # the database is down: beat again later
                logger.warning("runner heartbeat failed: %s: %s", type(exc).__name__, exc)

    @property
    def worker_names(self) -> list[str]:
        return [e.name for e in self.executor.entries]

    async def submit(self, request: SubmitRequest) -> uuid.UUID:
        self.executor.entries_for(request.pool)  # refuses unknown workers before recording
        workflow_id, now = uuid.uuid4(), utcnow()

        def record(conn: Connection) -> None:
            record_workflow(conn, request, workflow_id, now, runner_id=self.runner_id)

        # The run starts while its record commits (every write of the run is queued after the
        # record), but the caller hears of it only once the record is committed: an accepted
        # workflow is never lost.
        recorded = self.store.record(record)
        if request.stream_answer:  # its pieces are kept from now until its run has ended
            self.pieces.open(workflow_id)
        task = asyncio.create_task(
            self.executor.run(
                request.question,
                request.variant,
                workflow_id=workflow_id,
                pool=request.pool,
                created_at=now,
                answer_format=request.answer_format,
                tenant=request.tenant,
                tools=request.tools,
                stream_answer=request.stream_answer,
                trace_parent=request.trace_parent,
            ),
            name=f"workflow-{workflow_id}",
        )
        self._running[workflow_id] = task
        task.add_done_callback(lambda done: self._finished(workflow_id, done))
        if not await asyncio.shield(recorded):
            task.cancel()  # refused: nothing of it runs on once the caller hears so
            await asyncio.wait({task})
            raise DatabaseUnavailableError("cannot record the workflow in the trace database")
        return workflow_id

    def poll_interval_s(self, workflow_id: uuid.UUID) -> float:
        # Every event of a workflow run here is announced here (a finished one's last event
        # is remembered); one run by another replica on the database is polled for.
        return ANNOUNCED_POLL_S if workflow_id in self._running else POLL_INTERVAL_S

    async def wait_for_run(self, workflow_id: uuid.UUID) -> bool:
        task = self._running.get(workflow_id)
        if task is None:  # finished already, or run elsewhere: its events say
            return False
        # The run ends once its outcome is committed; no event read is needed to know it.
        await asyncio.wait({task})
        return True

    async def request_cancel(self, workflow_id: uuid.UUID, reason: str) -> None:
        task = self._running.get(workflow_id)
        if task is None:
            # Run by another `conductor serve` on this database, or it just ended: this process
            # cannot reach it.
            raise WorkflowElsewhere(workflow_id)
        task.cancel(Cancelled(reason))
        await asyncio.wait({task})  # its outcome, cancelled, is committed when it ends

    def _finished(self, workflow_id: uuid.UUID, task: asyncio.Task[WorkflowRecord]) -> None:
        self._running.pop(workflow_id, None)
        # Its streamed answer's pieces go once the readers attached now have read them.
        self.pieces.end(workflow_id)
        if not task.cancelled() and task.exception() is not None:
            logger.error("workflow task failed", exc_info=task.exception())

    async def readiness(self) -> dict[str, str]:
        def ping() -> None:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))

        checks = {"database": "ok", "workers": "ok"}
        try:
            await asyncio.to_thread(ping)
        except Exception as exc:
            checks["database"] = f"unreachable: {type(exc).__name__}"
        failing = self.store.commits.failing
        if failing is not None and checks["database"] == "ok":
            # Reads answer while writes fail (a full disk): not ready to accept work.
            held = self.store.commits.held
            checks["database"] = f"writes failing ({held} held for a retry): {failing}"
        if not self.worker_names:
            checks["workers"] = "no worker in the pool can be called"
        return checks

    async def aclose(self) -> None:
        """Workflows still running are cancelled; each records that it did not finish."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.flush()
        if self._webhooks is not None:  # what is due stays due: the next start delivers it
            self._webhooks.cancel()
            await asyncio.gather(self._webhooks, return_exceptions=True)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            try:
                await asyncio.to_thread(unregister_runner, self.engine, self.runner_id)
            except Exception as exc:  # it will be forgotten once stale
                logger.warning("cannot unregister runner %s: %s", self.runner_id, exc)
