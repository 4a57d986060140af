"""The distributed aggregator: the workflow state machine driven by queue messages.

Each message (a workflow start, a planning round, a step result, a passed deadline) is one
transaction: lock the workflow's run row, load its state, apply what happened, write traces and
numbered events, save the state, and stage what the machine now calls for (steps for the
vendor queues, planning rounds for the aggregator queue) in the outbox table; commit; then send
the staged messages (their rows are deleted in batches, ``outbox.SentRows``); only then is the
message acknowledged (acks_late). A workflow's first round is planned by the thread that takes
its start message, before anything is written, and one transaction then starts the workflow
with its plan (``start``): a transaction, a publish and a delivery fewer than a start that
sends its round through the queue.

Why sends follow the commit (issue 36 #13): sent before it, a step went out from a transaction
that could still fail or die (the broker's publish retries, a killed process, the database),
and the redelivered message sent it again, a second provider call. Now a transaction that does
not commit sends nothing. One that commits and then dies before its sends leaves them in the
outbox, and every aggregator's sweeper sends rows older than ``outbox.GRACE_S``; their
triggering message, redelivered, changes nothing. A message can so go out twice (sent, then
the process died before deleting the row): gateways key each call by its step
(``messaging.step_key``), so a repeat does not call the provider again (see
conductor_gateway.celery_app).

Step results survive an aggregator killed -9 (issue 36 #11). On the Redis broker kombu pops a
message and only then records it as unacknowledged: a process killed in between (under load,
the popped reply can sit in the socket or the GIL's queue for milliseconds) loses it, and
acks_late cannot help. So gateways record each answer in Redis before sending it, listed as
unapplied; an aggregator takes it off the list once its transaction committed the answer, and
the sweeper applies the answers listed longer than ``REPLY_GRACE_S``: a lost result is applied
within that plus a sweep, not at the step's deadline (600 s). Applied twice, it changes nothing.

The planner is called outside any lock (a plan takes seconds): the plan task reads the state,
asks the planner, then applies the plan in its own transaction if the round still waits for it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime

import httpx
import redis
from celery import Celery
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DataError

from conductor.errors import ConfigurationError, PlannerError
from conductor.machine import (
    Aborted,
    Action,
    Cancelled,
    DeadlinesPassed,
    Dispatch,
    Fact,
    MachineEvent,
    MessagesLost,
    PlanFailed,
    PlanReady,
    RequestPlan,
    StepFailed,
    StepSucceeded,
    WorkflowMachine,
    utcnow,
)
from conductor.messaging import (
    AGGREGATOR_QUEUE,
    CALL_WORKER_TASK,
    DELIVER_WEBHOOK_TASK,
    PLAN_ROUND_TASK,
    CallReply,
    CallRequest,
    StepContext,
    answer_stream_key,
    ended_channel,
    queue_for,
    reply_key,
    step_key,
    unapplied_key,
)
from conductor.pool import Pool
from conductor.ports import Planner
from conductor.tracing import planning_span, record_workflow_span, workflow_traceparent
from conductor.workflow import PlanOutcome, PoolEntry
from conductor_adapters.loop_thread import LoopThread
from conductor_adapters.queue import RedisBrokerWatch, send
from conductor_adapters.store import outbox
from conductor_adapters.store.runs import (
    PlanLeases,
    RunRow,
    active_runs,
    due_runs,
    give_up_plan,
    lock_run,
    postpone_start,
    save_run,
    send_start,
    take_to_plan,
)
from conductor_adapters.store.traces import TraceWrites
from conductor_adapters.webhooks import attempt, claim_due
from conductor_aggregator.metrics import AggregatorMetrics

logger = logging.getLogger(__name__)

# A recorded answer not yet applied this long was lost on its way: well above a step result's
# usual wait in the aggregator queue, far below a step's deadline.
REPLY_GRACE_S = 10.0
# An applied answer's record outlives the outbox's grace, for sends of its step still queued.
APPLIED_REPLY_KEEP_S = 120

Change = Callable[[Connection, RunRow], WorkflowMachine | None]
"""What a message does to a locked run: the machine to advance and save, or None (no change)."""


def _applying(fact: Fact) -> Change:
    """The change that applies ``fact`` to a started workflow; None (nothing saved) when the
    workflow has not started or the fact no longer applies."""

    def change(conn: Connection, run: RunRow) -> WorkflowMachine | None:
        if run.state is None:
            return None
        machine = WorkflowMachine(run.state)
        return machine if machine.apply(fact) else None

    return change


def events_channel(prefix: str, workflow_id: uuid.UUID | str) -> str:
    """The Redis channel that announces a workflow's new events (the API listens on it)."""
    return f"{prefix}events:{workflow_id}"


class Aggregator:
    def __init__(
        self,
        *,
        engine: Engine,
        app: Celery,
        planner: Planner,
        loop: LoopThread,
        pool: Pool,
        writes: TraceWrites,
        redis_client: redis.Redis | None = None,
        redis_prefix: str = "conductor:",
        planner_timeout_s: float = 300.0,
        broker_watch: RedisBrokerWatch | None = None,
        metrics: AggregatorMetrics | None = None,
        plan_on_start: bool = True,
    ) -> None:
        if engine.dialect.name != "postgresql":
            raise ConfigurationError(
                "the distributed aggregator needs PostgreSQL (one row lock per workflow): set "
                "CONDUCTOR_DATABASE_URL=postgresql+psycopg://USER@HOST:PORT/DBNAME"
            )
        self.engine = engine
        self._webhooks: httpx.Client | None = None  # made on the first delivery
        self.app = app
        self.planner = planner
        self.loop = loop
        self.pool = pool
        self.writes = writes
        self.redis = redis_client
        self.redis_prefix = redis_prefix
        self.planner_timeout_s = planner_timeout_s
        self.broker_watch = broker_watch
        self.metrics = metrics
        # A workflow's first round is planned by the thread that takes its start (``start``);
        # False starts it first and sends the round through the queue like every other.
        self.plan_on_start = plan_on_start
        self.sent_rows = outbox.SentRows(engine)
        self.plan_leases = PlanLeases(engine)  # the queued runs this process plans

    def deliver_webhook(self, delivery_id: str) -> None:
        """One attempt at a webhook delivery (a failed one is claimed again when due)."""
        if self._webhooks is None:
            self._webhooks = httpx.Client(follow_redirects=False)
        attempt(self.engine, delivery_id, self._webhooks)

    def close(self) -> None:
        if self._webhooks is not None:
            self._webhooks.close()
        aclose = getattr(self.planner, "aclose", None)
        if aclose is not None:
            self.loop.run(aclose(), timeout_s=10)
        self.loop.stop()
        self.sent_rows.close()
        self.plan_leases.close()
        if self.redis is not None:
            self.redis.close()
        if self.broker_watch is not None:
            self.broker_watch.close()
        self.engine.dispose()

    # -- message handlers -------------------------------------------------------------------

    def start(self, workflow_id: uuid.UUID) -> None:
        """Start a queued workflow. Its first round is planned first, under a lease on the run
        (``take_to_plan``), then one transaction records the start and the plan; a planner to
        be tried again has the workflow started without it, its round sent through the queue,
        whose task tries again with backoff."""
        if not self.plan_on_start:
            self._change(workflow_id, self._beginning(workflow_id))
            return
        with self.engine.begin() as conn:
            run = take_to_plan(conn, workflow_id, utcnow())
        if run is None:
            return  # started already, planned by another process now, or not here
        self.plan_leases.hold(workflow_id)
        try:
            self._start_planned(workflow_id, run)
        except Exception:
            give_up_plan(self.engine, workflow_id)  # a redelivered start takes it at once
            raise
        finally:
            self.plan_leases.release(workflow_id)

    def _start_planned(self, workflow_id: uuid.UUID, run: RunRow) -> None:
        machine = self._new_machine(workflow_id, run)
        facts: list[Fact] = []
        for action in machine.advance():  # the first round's request, unless it failed at once
            if isinstance(action, RequestPlan):
                trace_parent = run.request.trace_parent
                try:
                    facts.append(
                        self._planned(workflow_id, machine, action.round, trace_parent, False)
                    )
                except PlannerError:  # retryable: the queue's task tries again with backoff
                    self._change(workflow_id, self._beginning(workflow_id))
                    return

        def begin(conn: Connection, locked: RunRow) -> WorkflowMachine | None:
            if locked.state is not None:
                return None  # started meanwhile (a repeated start message), or cancelled
            for fact in facts:
                machine.apply(fact)
            return machine

        self._change(workflow_id, begin)

    def _beginning(self, workflow_id: uuid.UUID) -> Change:
        """The change that starts a queued workflow, its first round for the queue."""

        def begin(conn: Connection, run: RunRow) -> WorkflowMachine | None:
            if run.state is not None:
                return None  # a duplicate start: it is running already (or was cancelled)
            return self._new_machine(workflow_id, run)

        return begin

    def _new_machine(self, workflow_id: uuid.UUID, run: RunRow) -> WorkflowMachine:
        """The machine of a submitted run; it fails at once if its pool names workers this
        aggregator's pool does not have."""
        request = run.request
        entries, unknown = self._entries(request.pool)
        machine = WorkflowMachine.start(
            workflow_id=workflow_id,
            question=request.question,
            variant=request.variant,
            entries=entries,
            created_at=run.created_at,
            answer_format=request.answer_format,
            tenant=request.tenant,
            tools=request.tools,
            tool_workers=self.pool.tool_workers,
            # Streamed through Redis: without it the answer comes whole.
            stream_answer=request.stream_answer and self.redis is not None,
        )
        if unknown:
            machine.apply(Aborted(f"workers not in the pool: {', '.join(unknown)}"))
        return machine

    def cancel(self, workflow_id: uuid.UUID, reason: str) -> None:
        """End the workflow cancelled, started or not: a start that arrives later finds it
        finished, and the gateways stop its calls in flight when its end is announced."""
        self._change(workflow_id, self._ending(workflow_id, Cancelled(reason)))

    def _ending(self, workflow_id: uuid.UUID, fact: Aborted | Cancelled) -> Change:
        """The change that ends a workflow with ``fact``, started or not (one not started is
        started and ended in one change)."""

        def ending(conn: Connection, run: RunRow) -> WorkflowMachine | None:
            if run.state is None:
                machine = self._new_machine(workflow_id, run)
                machine.apply(fact)
                return machine
            machine = WorkflowMachine(run.state)
            return machine if machine.apply(fact) else None

        return ending

    def plan(self, workflow_id: uuid.UUID, round_no: int, *, final_try: bool = True) -> None:
        """Ask the planner for a round's plan. A retryable PlannerError is raised for the round
        to be tried again, unless this is the final try: then the round fails with it."""
        # Read under the row lock, released at once: this message can arrive before the
        # transaction that sent it commits, and the lock waits for that commit.
        with self.engine.begin() as conn:
            run = lock_run(conn, workflow_id)
        if run is None or run.state is None:
            return
        waiting = WorkflowMachine(run.state)
        if waiting.state.finished or waiting.state.planning_round != round_no:
            return  # a duplicate, or a round already planned or given up
        trace_parent = run.request.trace_parent
        fact = self._planned(workflow_id, waiting, round_no, trace_parent, final_try)
        self._apply(workflow_id, fact)

    def _planned(
        self,
        workflow_id: uuid.UUID,
        waiting: WorkflowMachine,
        round_no: int,
        trace_parent: str | None,
        final_try: bool,
    ) -> PlanReady | PlanFailed:
        """The planner's answer for a round, as the fact to apply: the plan, or the round
        failed with the reason. A retryable PlannerError is raised unless ``final_try``."""
        request = waiting.plan_request(round_no)
        parent = workflow_traceparent(workflow_id, trace_parent)

        async def planned() -> PlanOutcome:
            # The span is made in the loop's thread, where the call runs.
            with planning_span(round_no, parent):
                return await self.planner.plan(request)

        try:
            outcome = self.loop.run(planned(), timeout_s=self.planner_timeout_s + 10)
        except Exception as exc:
            if isinstance(exc, PlannerError) and exc.retryable and not final_try:
                raise
            return PlanFailed(round_no, str(exc) or type(exc).__name__)
        return PlanReady(round_no, outcome)

    def step_result(self, reply: CallReply) -> None:
        context = reply.context
        if context is None:
            logger.warning("a step result without its step (call %s); ignored", reply.call_id)
            return

        fact: Fact
        if reply.ok and reply.result is not None:
            fact = StepSucceeded(context.step, reply.result)
        else:
            error = f"StepCallFailed: {reply.error or 'the gateway reported a failure'}"
            fact = StepFailed(context.step, error, tuple(reply.attempts))
        self._apply(uuid.UUID(context.workflow_id), fact)
        # Committed (or applied before): the sweeper need not apply it, and its record is
        # kept only for sends of the step still on their way.
        if self.redis is not None:
            key = step_key(context)
            try:
                applied = self.redis.pipeline(transaction=False)
                applied.zrem(unapplied_key(self.redis_prefix), key)
                applied.expire(reply_key(self.redis_prefix, key), APPLIED_REPLY_KEEP_S)
                applied.execute()
            except (redis.RedisError, OSError) as exc:
                logger.warning("cannot mark a step result applied (%s); applied twice", exc)

    def recover_replies(self, now_s: float | None = None) -> int:
        """Apply the answers gateways recorded whose step result never arrived (lost with an
        aggregator killed between the broker and its bookkeeping); returns how many."""
        if self.redis is None:
            return 0
        unapplied = unapplied_key(self.redis_prefix)
        before = (time.time() if now_s is None else now_s) - REPLY_GRACE_S
        try:
            found = self.redis.zrangebyscore(unapplied, "-inf", before, 0, 100)
            keys = [k.decode() if isinstance(k, bytes) else str(k) for k in found]
            records = [reply_key(self.redis_prefix, k) for k in keys]
            bodies = self.redis.mget(records) if records else []
        except (redis.RedisError, OSError) as exc:
            logger.warning("cannot look for lost step results (%s)", exc)
            return 0
        applied = 0
        for key, body in zip(keys, bodies, strict=True):
            if body is None:  # expired: nothing left to apply
                self.redis.zrem(unapplied, key)
                continue
            self.step_result(CallReply.model_validate_json(body))
            applied += 1
        if applied:
            logger.warning("applied %d step results recorded but never received", applied)
            if self.metrics is not None:
                self.metrics.sweeps.labels("recovered").inc(applied)
        return applied

    def sweep(self, now: datetime | None = None) -> int:
        """Act on every run whose deadline has passed, and on every active run when the broker
        lost its messages; returns how many were looked at."""
        now = now or utcnow()
        self.flush_outbox(now)
        self.recover_replies(now.timestamp())
        for delivery_id in claim_due(self.engine, now):  # webhooks due: one task each
            send(self.app, DELIVER_WEBHOOK_TASK, [delivery_id], AGGREGATOR_QUEUE)
        if self.broker_watch is not None and self.broker_watch.lost_data():
            return self.resend_lost(now)
        with self.engine.connect() as conn:
            due = due_runs(conn, now)

        def expire(conn: Connection, run: RunRow) -> WorkflowMachine | None:
            if run.state is None:  # queued, and its start message was lost: send it again
                send_start(self.app, run.workflow_id)
                postpone_start(conn, run.workflow_id, now)
                return None
            machine = WorkflowMachine(run.state)
            machine.apply(DeadlinesPassed(now))
            return machine  # saved either way: its next deadline is recomputed

        for workflow_id in due:
            self._change(workflow_id, expire)
        if self.metrics is not None and due:
            self.metrics.sweeps.labels("deadline").inc(len(due))
        return len(due)

    def resend_lost(self, now: datetime | None = None) -> int:
        """The broker lost its messages: start again each queued workflow and send again what
        every running one has in flight, at once rather than at their deadlines (600 s by
        default). Replies that arrive after all count once. Returns how many were looked at."""
        now = now or utcnow()
        with self.engine.connect() as conn:
            active = active_runs(conn)
        if active:
            logger.warning("the broker lost its messages; resending for %d workflows", len(active))

        def resend(conn: Connection, run: RunRow) -> WorkflowMachine | None:
            if run.state is None:
                send_start(self.app, run.workflow_id)
                postpone_start(conn, run.workflow_id, now)
                return None
            return _applying(MessagesLost())(conn, run)

        for workflow_id in active:
            self._change(workflow_id, resend)
        if self.metrics is not None and active:
            self.metrics.sweeps.labels("resent").inc(len(active))
        return len(active)

    def flush_outbox(self, now: datetime | None = None) -> int:
        """Send the messages whose aggregator committed them but did not send them (it died, or
        the broker was unreachable); returns how many were sent."""
        now = now or utcnow()
        self.sent_rows.flush()  # rows known sent are not stale, however old
        with self.engine.begin() as conn:
            stale = outbox.take_stale(conn, now)
            done = self._send_staged(stale)
            outbox.forget(conn, done)
        if stale:
            logger.warning("sent %d of %d messages left unsent", len(done), len(stale))
        return len(done)

    # -- one transaction per message --------------------------------------------------------

    def _apply(self, workflow_id: uuid.UUID, fact: Fact) -> None:
        """Apply one fact to a running workflow; nothing happens when it no longer applies."""
        self._change(workflow_id, _applying(fact))

    def _change(self, workflow_id: uuid.UUID, change: Change) -> None:
        try:
            self._change_once(workflow_id, change)
        except DataError as exc:
            # The database refuses this data (a provider reporting more tokens than a column
            # holds, say): every retry would fail alike and send again what the change sends.
            # The workflow ends instead, with the reason.
            detail = str(exc.orig).strip().partition("\n")[0] or "DataError"
            reason = f"the trace store refused this workflow's data: {detail}"
            logger.error("workflow %s: %s", workflow_id, reason)
            self._change_once(workflow_id, self._ending(workflow_id, Aborted(reason)))

    def _change_once(self, workflow_id: uuid.UUID, change: Change) -> None:
        """One transaction; then what it calls for goes out."""
        with self.engine.begin() as conn:
            run = lock_run(conn, workflow_id)
            if run is None:
                logger.warning("no workflow %s here; a message for it is ignored", workflow_id)
                return
            machine = change(conn, run)
            if machine is None:
                return
            trace_parent = workflow_traceparent(workflow_id, run.request.trace_parent)
            messages = [
                self._message(workflow_id, action, trace_parent) for action in machine.advance()
            ]
            events = machine.take_events()
            self.writes.for_events(machine.result, events)(conn)
            save_run(conn, workflow_id, machine.state)
            staged = outbox.stage(conn, workflow_id, messages, utcnow())
        # Committed: what it calls for goes out now (or, failing that, by a sweeper).
        self.sent_rows.add(self._send_staged(staged))
        if self.metrics is not None:  # committed: counted once
            self.metrics.record(machine.result, events)
        self._announce(workflow_id, [e for e in events if e.sequence])
        if any(event.kind.final for event in events):
            record_workflow_span(machine.result, run.request.tenant, run.request.trace_parent)

    def _send_staged(self, staged: list[outbox.Staged]) -> list[int]:
        """Send staged messages in order until the broker fails; the ids of those sent."""
        done: list[int] = []
        for item in staged:
            message = item.message
            try:
                send(self.app, message.task, message.args, message.queue)
            except (BrokerError, OSError) as exc:
                # Committed already: the rows stay, and a sweeper sends them once the broker
                # answers. Raising would only redeliver a message that now changes nothing.
                logger.warning("cannot send %s (%s); the sweeper will", message.task, exc)
                break
            done.append(item.id)
        return done

    def _message(
        self, workflow_id: uuid.UUID, action: Action, trace_parent: str | None
    ) -> outbox.Message:
        if isinstance(action, Dispatch):
            request = CallRequest(
                call_id=f"{workflow_id}:{action.step}:{action.dispatch}",
                worker=action.worker,
                messages=action.messages,
                reply_queue=AGGREGATOR_QUEUE,
                context=StepContext(
                    workflow_id=str(workflow_id), step=action.step, dispatch=action.dispatch
                ),
                allowed_workers=action.allowed_workers,
                tenant=action.tenant,
                tools=action.tools,
                answer_format=action.answer_format,
                answer_stream=answer_stream_key(self.redis_prefix, workflow_id)
                if action.streams
                else None,
                expires_at=action.expires_at,
                trace_parent=trace_parent,
            )
            queue = queue_for(self.pool.get(action.worker))
            return outbox.Message(CALL_WORKER_TASK, queue, [request.model_dump(mode="json")])
        return outbox.Message(PLAN_ROUND_TASK, AGGREGATOR_QUEUE, [str(workflow_id), action.round])

    def _announce(self, workflow_id: uuid.UUID, events: list[MachineEvent]) -> None:
        """Tell listeners (the API) that events were stored, and gateways that the workflow
        ended; best effort, since the database has the events (a listener that missed a notice
        reads them there) and a call not cancelled only finishes unused."""
        if self.redis is None or not events:
            return
        channel = events_channel(self.redis_prefix, workflow_id)
        try:
            # One round trip; one notice for the change's events, naming the last: a reader
            # reads every event up to it.
            notices = self.redis.pipeline(transaction=False)
            last = max(events, key=lambda event: event.sequence)
            notices.publish(channel, json.dumps({"sequence": last.sequence, "kind": last.kind}))
            if any(event.kind.final for event in events):
                notices.publish(ended_channel(self.redis_prefix), str(workflow_id))
            notices.execute()
        except (redis.RedisError, OSError) as exc:
            logger.warning("cannot announce events of %s (%s); they are stored", workflow_id, exc)

    def _entries(self, names: list[str] | None) -> tuple[list[PoolEntry], list[str]]:
        """The workers the Conductor sees, in pool order; and requested names not in the pool."""
        known = {w.name for w in self.pool.workers}
        wanted = set(names) if names is not None else known
        entries = [
            PoolEntry(name=w.name, description=w.description)
            for w in self.pool.workers
            if w.name in wanted
        ]
        return entries, sorted(wanted - known)
