"""The aggregator's message handlers on real Postgres: duplicates change nothing, deadlines end
every workflow, a lost start is sent again.

The handlers are called directly (as a Celery task would call them) with a Celery app whose
``send_task`` is recorded rather than published, so each test decides which message arrives and
how often. The queues themselves are covered by test_executor.py and test_distributed_stack.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from kombu.exceptions import OperationalError as BrokerOperationalError
from sqlalchemy import Engine, func, select

from conductor.chat import Usage
from conductor.errors import PlannerUnavailable
from conductor.machine import utcnow
from conductor.messaging import (
    CALL_WORKER_TASK,
    PLAN_ROUND_TASK,
    START_WORKFLOW_TASK,
    CallReply,
    CallRequest,
    reply_key,
    step_key,
    unapplied_key,
)
from conductor.pool import Pool, Price, Provider, WorkerSpec
from conductor.ports import PlanRequest, StepCallResult
from conductor.variants import BUILTIN_VARIANTS, Variant
from conductor.workflow import AttemptRecord, PlanOutcome, WorkflowStatus
from conductor_adapters.loop_thread import LoopThread
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.models import (
    attempt_table,
    event_table,
    outbox_table,
    run_table,
    step_table,
    workflow_table,
)
from conductor_adapters.store.outbox import GRACE_S
from conductor_adapters.store.runs import (
    PLAN_LEASE_S,
    PlanLeases,
    SubmitRequest,
    load_run,
    record_submission,
    take_to_plan,
)
from conductor_adapters.store.traces import TraceWrites
from conductor_aggregator.metrics import AggregatorMetrics
from conductor_aggregator.service import REPLY_GRACE_S, Aggregator
from conductor_planner import ConductorPlanner

from fakes.scripted import ScriptedBackend, lists

pytestmark = pytest.mark.postgres

POOL = Pool(
    workers=tuple(
        WorkerSpec(
            name=n,
            provider=Provider.OPENAI_COMPATIBLE,
            model=n,
            base_url="http://127.0.0.1:9",
            price=Price(input=1.0, output=1.0),
        )
        for n in ("alpha", "beta")
    )
)
TWO_STEPS = lists([0, 1], ["Solve.", "Check."], [[], ["all"]])


@dataclass
class RecordingApp:
    """Stands in for the Celery app's publishing side: records each message sent."""

    sent: list[tuple[str, list[Any], str]] = field(default_factory=list)

    def send_task(self, name: str, *, args: list[Any], queue: str, **_: Any) -> None:
        self.sent.append((name, args, queue))

    def take(self, name: str) -> list[list[Any]]:
        taken = [args for sent, args, _ in self.sent if sent == name]
        self.sent = [s for s in self.sent if s[0] != name]
        return taken


# Aggregators a test built: their threads (deleting sent rows, renewing leases) stop before the
# database goes.
_built: list[Aggregator] = []


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    upgrade(postgres_url)
    engine = make_engine(postgres_url)
    yield engine
    while _built:
        built = _built.pop()
        built.sent_rows.close()
        built.plan_leases.close()
    engine.dispose()


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("test-loop")
    yield thread
    thread.stop()


def _aggregator(
    engine: Engine, loop: LoopThread, outputs: list[str], *, plan_on_start: bool = False
) -> tuple[Aggregator, RecordingApp]:
    """An aggregator whose every planning round goes through the queue, unless
    ``plan_on_start`` (as deployed): the first is planned by the thread that starts it."""
    app = RecordingApp()
    aggregator = Aggregator(
        engine=engine,
        app=app,  # type: ignore[arg-type]
        planner=ConductorPlanner(ScriptedBackend(outputs=outputs)),
        loop=loop,
        pool=POOL,
        writes=TraceWrites("postgresql", POOL, sole_writer=True),  # as deployed
        metrics=AggregatorMetrics(),
        plan_on_start=plan_on_start,
    )
    _built.append(aggregator)
    return aggregator, app


def _metric(aggregator: Aggregator, name: str, **labels: str) -> float:
    assert aggregator.metrics is not None
    value = aggregator.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _submit(engine: Engine, variant: Variant = BUILTIN_VARIANTS["conductor-ultra"]) -> uuid.UUID:
    workflow_id = uuid.uuid4()
    with engine.begin() as conn:
        request = SubmitRequest(question="What is 2 + 2?", variant=variant)
        record_submission(conn, request, workflow_id, utcnow())
    return workflow_id


def _answer(call: list[Any], text: str = "4") -> CallReply:
    request = CallRequest.model_validate(call[0])
    attempt = AttemptRecord(
        number=1,
        worker=request.worker,
        status="ok",
        usage=Usage(prompt_tokens=3, completion_tokens=1),
        cost_usd=4e-6,
        started_at=utcnow(),
    )
    result = StepCallResult(
        text=text, worker=request.worker, usage=attempt.usage, cost_usd=4e-6, attempts=[attempt]
    )
    return CallReply(
        call_id=request.call_id,
        ok=True,
        result=result,
        attempts=[attempt],
        context=request.context,
    )


def _counts(engine: Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(t)).scalar()
            for t in (step_table, attempt_table, event_table)
        )


def test_every_message_delivered_twice_changes_nothing(engine: Engine, loop: LoopThread) -> None:
    # Given a submitted workflow and an aggregator
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine)

    # When every message is delivered twice, answers included
    aggregator.start(workflow_id)
    aggregator.start(workflow_id)
    [plan] = app.take(PLAN_ROUND_TASK)
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    [first] = app.take(CALL_WORKER_TASK)
    aggregator.step_result(_answer(first))
    counts_after_first = _counts(engine)
    aggregator.step_result(_answer(first, "a different, later answer"))
    assert _counts(engine) == counts_after_first
    [second] = app.take(CALL_WORKER_TASK)
    aggregator.step_result(_answer(second))
    aggregator.step_result(_answer(second))

    # Then it ran once: one plan, two steps sent once each, one attempt per step, events 1..n
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
        events = conn.execute(
            select(event_table.c.sequence, event_table.c.kind).order_by(event_table.c.sequence)
        ).all()
    assert run is not None
    assert run.state is not None
    result = run.state.result
    assert result.status is WorkflowStatus.COMPLETED
    assert len(result.planner_calls) == 1
    assert result.answer == "4"
    assert result.steps[0].output == "4"
    assert app.sent == []
    assert _counts(engine)[:2] == (2, 2)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events] == [
        "plan",
        "step_started",
        "step_finished",
        "step_started",
        "step_finished",
        "completed",
    ]
    # And its metrics count it once: one valid plan, two steps, one completed workflow
    workflow = {"variant": "conductor-ultra", "outcome": "completed"}
    assert _metric(aggregator, "conductor_workflows_total", **workflow) == 1
    assert _metric(aggregator, "conductor_workflow_duration_seconds_count", **workflow) == 1
    assert _metric(aggregator, "conductor_plans_total", valid="true") == 1
    assert _metric(aggregator, "conductor_planner_call_duration_seconds_count") == 1
    for worker in ("alpha", "beta"):
        step = {"worker": worker, "outcome": "succeeded"}
        assert _metric(aggregator, "conductor_step_duration_seconds_count", **step) == 1


def test_a_workflow_cancelled_before_it_started_never_starts(
    engine: Engine, loop: LoopThread
) -> None:
    # Given a submitted workflow whose start message has not been handled yet
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine)

    # When its cancel is handled first, then its start
    aggregator.cancel(workflow_id, "cancelled by its client")
    aggregator.start(workflow_id)

    # Then it ended cancelled, and nothing was planned or called
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.state is not None
    assert run.state.result.status is WorkflowStatus.CANCELLED
    assert run.state.result.error == "cancelled by its client"
    assert app.take(PLAN_ROUND_TASK) == []
    assert app.take(CALL_WORKER_TASK) == []


def test_an_answer_the_database_cannot_store_fails_the_workflow_once(
    engine: Engine, loop: LoopThread
) -> None:
    # Given a workflow whose first step is answered with more tokens than a column holds (a
    # provider's usage is untrusted; PostgreSQL's integer stops at 2**31 - 1)
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine)
    aggregator.start(workflow_id)
    [plan] = app.take(PLAN_ROUND_TASK)
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    [first] = app.take(CALL_WORKER_TASK)
    reply = _answer(first)
    assert reply.result is not None
    huge = Usage(prompt_tokens=2**31, completion_tokens=1)
    reply = reply.model_copy(update={"result": reply.result.model_copy(update={"usage": huge})})

    # When it arrives, and is delivered again (as a retried message would be)
    aggregator.step_result(reply)
    aggregator.step_result(reply)

    # Then the workflow failed with the reason, and the next step went out once at most
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.state is not None
    assert run.state.result.status is WorkflowStatus.FAILED
    assert "the trace store refused this workflow's data" in (run.state.result.error or "")
    assert "out of range" in (run.state.result.error or "")
    assert len(app.take(CALL_WORKER_TASK)) <= 1


def test_a_step_without_an_answer_is_sent_once_more_then_fails_the_workflow(
    engine: Engine, loop: LoopThread
) -> None:
    # Given a running step whose worker never answers (its message or its answer was lost)
    variant = BUILTIN_VARIANTS["conductor-ultra"].model_copy(update={"step_timeout_s": 5})
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine, variant)
    aggregator.start(workflow_id)
    [plan] = app.take(PLAN_ROUND_TASK)
    aggregator.plan(workflow_id, plan[1])
    [sent] = app.take(CALL_WORKER_TASK)

    # When its deadline passes, and passes again
    aggregator.sweep(utcnow() + timedelta(seconds=6))
    [resent] = app.take(CALL_WORKER_TASK)
    aggregator.sweep(utcnow() + timedelta(seconds=12))

    # Then it was sent again once (a new call id, the same step), and then the workflow failed
    # with the reason, its steps ended
    assert (
        CallRequest.model_validate(resent[0]).call_id != CallRequest.model_validate(sent[0]).call_id
    )
    assert CallRequest.model_validate(resent[0]).context == CallRequest.model_validate(
        sent[0]
    ).context.model_copy(update={"dispatch": 2})  # type: ignore[union-attr]
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.state is not None
    result = run.state.result
    assert result.status is WorkflowStatus.FAILED
    assert result.error is not None
    assert "no answer within 5 s, sent 2 times" in result.error
    assert [s.status.value for s in result.steps] == ["failed", "cancelled"]
    assert app.sent == []


def test_a_late_answer_after_the_resend_still_counts_once(engine: Engine, loop: LoopThread) -> None:
    variant = BUILTIN_VARIANTS["conductor-mini"].model_copy(update={"step_timeout_s": 5})
    aggregator, app = _aggregator(engine, loop, [lists([0], ["Answer."], [[]])])
    workflow_id = _submit(engine, variant)
    aggregator.start(workflow_id)
    aggregator.plan(workflow_id, app.take(PLAN_ROUND_TASK)[0][1])
    [sent] = app.take(CALL_WORKER_TASK)
    aggregator.sweep(utcnow() + timedelta(seconds=6))
    [resent] = app.take(CALL_WORKER_TASK)

    # When both the first call and the resent one answer
    aggregator.step_result(_answer(sent, "first"))
    aggregator.step_result(_answer(resent, "second"))

    # Then the first answer counts, once
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.state is not None
    assert run.state.result.answer == "first"
    assert _counts(engine)[1] == 1


def test_the_workflow_deadline_fails_a_workflow_waiting_on_its_plan(
    engine: Engine, loop: LoopThread
) -> None:
    variant = BUILTIN_VARIANTS["conductor-ultra"].model_copy(update={"workflow_timeout_s": 30})
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine, variant)
    aggregator.start(workflow_id)

    aggregator.sweep(utcnow() + timedelta(seconds=31))

    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.status == "failed"
    assert run.state is not None
    assert run.state.result.error == "no answer within the workflow deadline of 30 s"
    # The plan that arrives afterwards changes nothing
    aggregator.plan(workflow_id, app.take(PLAN_ROUND_TASK)[0][1])
    assert app.sent == []
    failed = {"variant": "conductor-ultra", "outcome": "failed"}
    assert _metric(aggregator, "conductor_workflows_total", **failed) == 1
    assert _metric(aggregator, "conductor_sweeper_actions_total", action="deadline") == 1
    assert _metric(aggregator, "conductor_plans_total", valid="true") == 0


def test_a_lost_start_message_is_sent_again(engine: Engine, loop: LoopThread) -> None:
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine)

    aggregator.sweep(utcnow() + timedelta(seconds=5))
    assert app.take(START_WORKFLOW_TASK) == []  # still within its grace
    aggregator.sweep(utcnow() + timedelta(seconds=31))

    assert app.take(START_WORKFLOW_TASK) == [[str(workflow_id)]]


def test_messages_for_unknown_workflows_are_ignored(engine: Engine, loop: LoopThread) -> None:
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])

    aggregator.start(uuid.uuid4())
    aggregator.plan(uuid.uuid4(), 0)

    assert app.sent == []
    assert _counts(engine) == (0, 0, 0)


def test_calls_of_a_step_cancelled_with_its_workflow_are_recorded_when_they_arrive(
    engine: Engine, loop: LoopThread
) -> None:
    """Every call that may be billed has an attempt row (issue 36 #12): a gateway cancelled
    mid-storm replies with the 429s it got, after the workflow ended."""
    # Given a workflow cancelled while its first step's call was being retried
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine)
    aggregator.start(workflow_id)
    [plan] = app.take(PLAN_ROUND_TASK)
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    [call] = app.take(CALL_WORKER_TASK)
    aggregator.cancel(workflow_id, "cancelled by its client")
    request = CallRequest.model_validate(call[0])
    storm = [
        AttemptRecord(
            number=n,
            worker=request.worker,
            status="error",
            status_code=429,
            error="Rate limit reached",
            started_at=utcnow(),
        )
        for n in (1, 2, 3)
    ]
    late = CallReply(
        call_id=request.call_id,
        ok=False,
        error="cancelled: its workflow had ended",
        attempts=storm,
        context=request.context,
    )
    steps_before, _, events_before = _counts(engine)

    # When the gateway's reply arrives, twice
    aggregator.step_result(late)
    aggregator.step_result(late)

    # Then the cancelled step has its three calls, once, and no event is streamed after the end
    with engine.connect() as conn:
        statuses = conn.execute(
            select(attempt_table.c.number, attempt_table.c.status_code).order_by(
                attempt_table.c.number
            )
        ).all()
        run = load_run(conn, workflow_id)
    assert [tuple(s) for s in statuses] == [(1, 429), (2, 429), (3, 429)]
    assert _counts(engine) == (steps_before, 3, events_before)
    assert run is not None
    assert run.state is not None
    assert run.state.result.status is WorkflowStatus.CANCELLED
    assert [len(s.attempts) for s in run.state.result.steps] == [3, 0]


# -- sends follow the commit (issue 36 #13) ---------------------------------------------------


@dataclass
class CheckingApp(RecordingApp):
    """Records, at each send, what another connection sees of the workflow then: whether the
    state that sends the message is committed already."""

    engine: Engine | None = None
    committed_at_send: list[bool] = field(default_factory=list)

    def send_task(self, name: str, *, args: list[Any], queue: str, **_: Any) -> None:
        assert self.engine is not None
        if name == CALL_WORKER_TASK:
            context = CallRequest.model_validate(args[0]).context
            assert context is not None
            with self.engine.connect() as conn:
                run = load_run(conn, uuid.UUID(context.workflow_id))
            assert run is not None
            assert run.state is not None
            self.committed_at_send.append(
                run.state.dispatches.get(context.step) == context.dispatch
            )
        super().send_task(name, args=args, queue=queue)


class BrokerDownApp(RecordingApp):
    """A broker that refuses every message, as kombu reports an unreachable one."""

    def send_task(self, name: str, *, args: list[Any], queue: str, **_: Any) -> None:
        raise BrokerOperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def _outbox_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(outbox_table)).scalar() or 0)


def test_steps_are_sent_only_after_the_state_that_sends_them_is_committed(
    engine: Engine, loop: LoopThread
) -> None:
    # Given an aggregator whose broker looks at the database whenever a step is sent
    aggregator, _ = _aggregator(engine, loop, [TWO_STEPS])
    app = CheckingApp(engine=engine)
    aggregator.app = app  # type: ignore[assignment]
    workflow_id = _submit(engine)

    # When the workflow runs through its plan and both steps
    aggregator.start(workflow_id)
    [plan] = app.take(PLAN_ROUND_TASK)
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    [first] = app.take(CALL_WORKER_TASK)
    aggregator.step_result(_answer(first))
    [second] = app.take(CALL_WORKER_TASK)
    aggregator.step_result(_answer(second))

    # Then each step was sent when its dispatch could already be read from another connection,
    # and nothing is left in the outbox
    assert app.committed_at_send == [True, True]
    aggregator.sent_rows.flush()  # as its thread does every 0.2 s
    assert _outbox_rows(engine) == 0


def test_messages_a_failed_send_left_behind_are_sent_by_the_sweeper_once(
    engine: Engine, loop: LoopThread
) -> None:
    # Given a workflow planned while the broker refuses every message
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    workflow_id = _submit(engine)
    aggregator.start(workflow_id)
    [plan] = app.take(PLAN_ROUND_TASK)
    aggregator.app = BrokerDownApp()  # type: ignore[assignment]
    aggregator.plan(uuid.UUID(plan[0]), plan[1])

    # Then the plan is committed and its first step waits in the outbox, not lost
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.state is not None
    assert run.state.dispatches == {0: 1}
    aggregator.sent_rows.flush()  # the round's message, sent
    assert _outbox_rows(engine) == 1

    # When the broker answers again, and the plan message is redelivered meanwhile
    aggregator.app = app  # type: ignore[assignment]
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    assert app.sent == []  # it changes nothing, sends nothing
    # and the sweeper runs, first within the grace an aggregator has for its own sends
    assert aggregator.flush_outbox(utcnow()) == 0
    assert aggregator.sweep(utcnow() + timedelta(seconds=GRACE_S + 1)) == 0

    # Then the step goes out once, as it was staged, and the outbox is empty
    [call] = app.take(CALL_WORKER_TASK)
    request = CallRequest.model_validate(call[0])
    assert request.context is not None
    assert (request.context.step, request.context.dispatch) == (0, 1)
    assert app.sent == []
    aggregator.sent_rows.flush()
    assert _outbox_rows(engine) == 0
    # and the workflow goes on to its end
    aggregator.step_result(_answer(call))
    [second] = app.take(CALL_WORKER_TASK)
    aggregator.step_result(_answer(second))
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.state is not None
    assert run.state.result.status is WorkflowStatus.COMPLETED


# -- step results lost on their way (issue 36 #11) --------------------------------------------


def test_a_step_result_recorded_by_its_gateway_but_never_delivered_is_applied_by_the_sweeper(
    engine: Engine, loop: LoopThread, redis_url: str, redis_prefix: str
) -> None:
    # Given a workflow whose first step was answered, and its answer recorded in Redis as a
    # gateway records it, but whose step-result message was lost (an aggregator killed -9
    # between the broker handing it over and kombu noting it unacknowledged)
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS])
    aggregator.redis = redis.Redis.from_url(redis_url)
    aggregator.redis_prefix = redis_prefix
    workflow_id = _submit(engine)
    aggregator.start(workflow_id)
    [plan] = app.take(PLAN_ROUND_TASK)
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    [first] = app.take(CALL_WORKER_TASK)
    answer = _answer(first)
    assert answer.context is not None
    key = step_key(answer.context)
    recorded_at = time.time()
    aggregator.redis.set(reply_key(redis_prefix, key), answer.model_dump_json())
    aggregator.redis.zadd(unapplied_key(redis_prefix), {key: recorded_at})

    # When the sweeper runs, within the grace a result has to arrive, then after it
    assert aggregator.recover_replies(recorded_at + 1) == 0
    assert app.take(CALL_WORKER_TASK) == []
    aggregator.sweep(utcnow() + timedelta(seconds=REPLY_GRACE_S + 1))

    # Then the answer is applied from the record: the next step is sent, the record is off
    # the list, and applying it again (the message turning up late) changes nothing
    [second] = app.take(CALL_WORKER_TASK)
    assert CallRequest.model_validate(second[0]).context.step == 1  # type: ignore[union-attr]
    assert aggregator.redis.zcard(unapplied_key(redis_prefix)) == 0
    counts = _counts(engine)
    aggregator.step_result(answer)
    assert _counts(engine) == counts
    assert app.sent == []
    assert _metric(aggregator, "conductor_sweeper_actions_total", action="recovered") == 1
    aggregator.redis.close()


# -- the first round planned by the thread that starts the workflow ---------------------------


@dataclass
class FlakyPlanner:
    """The scripted planner behind a connection that fails its first ``failures`` calls."""

    planner: ConductorPlanner
    failures: int = 1
    calls: int = 0

    async def plan(self, request: PlanRequest) -> PlanOutcome:
        self.calls += 1
        if self.calls <= self.failures:
            raise PlannerUnavailable("the planner is loading")
        return await self.planner.plan(request)


def test_a_started_workflow_is_planned_at_once_and_every_repeat_changes_nothing(
    engine: Engine, loop: LoopThread
) -> None:
    # Given an aggregator as deployed: the thread that starts a workflow plans its first round
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS], plan_on_start=True)
    workflow_id = _submit(engine)

    # When the workflow starts, and its start and its first round's message come again
    aggregator.start(workflow_id)
    [first] = app.take(CALL_WORKER_TASK)
    aggregator.start(workflow_id)
    aggregator.plan(workflow_id, 0)

    # Then no round went through the queue, the first step went out once, the round's staged
    # message is gone (it was planned), and the workflow runs on to its answer
    assert app.take(PLAN_ROUND_TASK) == []
    assert app.sent == []
    aggregator.sent_rows.flush()
    assert _outbox_rows(engine) == 0
    aggregator.step_result(_answer(first))
    [second] = app.take(CALL_WORKER_TASK)
    aggregator.step_result(_answer(second))
    with engine.connect() as conn:
        run = load_run(conn, workflow_id)
    assert run is not None
    assert run.state is not None
    assert run.state.result.status is WorkflowStatus.COMPLETED
    assert len(run.state.result.planner_calls) == 1
    # and its trace row, marked running when it was taken, recorded the pool it was offered
    with engine.connect() as conn:
        query = select(workflow_table.c.pool_snapshot).where(workflow_table.c.id == workflow_id)
        snapshot = conn.execute(query).scalar_one()
    assert [worker["name"] for worker in snapshot] == ["alpha", "beta"]


def test_a_first_round_the_planner_cannot_take_now_goes_through_the_queue(
    engine: Engine, loop: LoopThread
) -> None:
    # Given a planner that is loading when the workflow starts
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS], plan_on_start=True)
    planner = FlakyPlanner(aggregator.planner)  # type: ignore[arg-type]
    aggregator.planner = planner
    workflow_id = _submit(engine)

    # When the workflow starts
    aggregator.start(workflow_id)

    # Then its round is sent as a message (whose task tries again with backoff), and planned
    # when it is handled
    [plan] = app.take(PLAN_ROUND_TASK)
    assert app.sent == []
    aggregator.plan(uuid.UUID(plan[0]), plan[1])
    assert len(app.take(CALL_WORKER_TASK)) == 1
    assert planner.calls == 2


def test_a_start_whose_transaction_failed_is_taken_again_by_its_redelivered_message(
    engine: Engine, loop: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an aggregator whose transaction fails once, after the first round was planned
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS, TWO_STEPS], plan_on_start=True)
    planner = FlakyPlanner(aggregator.planner, failures=0)  # type: ignore[arg-type]
    aggregator.planner = planner
    for_events = aggregator.writes.for_events
    failures = [RuntimeError("the database went away")]

    def failing_once(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return for_events(*args)

    monkeypatch.setattr(aggregator.writes, "for_events", failing_once)
    workflow_id = _submit(engine)
    with pytest.raises(RuntimeError, match="went away"):
        aggregator.start(workflow_id)
    assert app.sent == []

    # When its start message is delivered again (the task's retry), at once
    aggregator.start(workflow_id)

    # Then it is taken, not left to its lease: planned again, its first step sent once
    assert planner.calls == 2
    assert len(app.take(CALL_WORKER_TASK)) == 1
    assert app.sent == []


def test_a_workflow_whose_aggregator_died_while_planning_is_started_once_its_lease_lapses(
    engine: Engine, loop: LoopThread
) -> None:
    # Given a queued workflow an aggregator took to plan, and which then died (no renewals)
    aggregator, app = _aggregator(engine, loop, [TWO_STEPS], plan_on_start=True)
    planner = FlakyPlanner(aggregator.planner, failures=0)  # type: ignore[arg-type]
    aggregator.planner = planner
    workflow_id = _submit(engine)
    taken_at = utcnow()
    with engine.begin() as conn:
        assert take_to_plan(conn, workflow_id, taken_at) is not None

    # When its start message comes again meanwhile, and sweepers look within the lease
    aggregator.start(workflow_id)
    aggregator.sweep(taken_at + timedelta(seconds=PLAN_LEASE_S - 1))

    # Then nobody plans it twice
    assert planner.calls == 0
    assert app.sent == []

    # And once the lease lapsed, a sweeper sends its start once, and whoever takes it plans
    aggregator.sweep(taken_at + timedelta(seconds=PLAN_LEASE_S + 1))
    assert app.take(START_WORKFLOW_TASK) == [[str(workflow_id)]]
    aggregator.start(workflow_id)
    assert planner.calls == 1
    assert len(app.take(CALL_WORKER_TASK)) == 1


def test_a_run_being_planned_is_dated_ahead_while_its_process_holds_its_lease(
    engine: Engine,
) -> None:
    # Given a queued workflow taken to plan
    workflow_id = _submit(engine)
    taken_at = utcnow()
    with engine.begin() as conn:
        run = take_to_plan(conn, workflow_id, taken_at)
        assert take_to_plan(conn, workflow_id, taken_at) is None  # taken: not twice
    assert run is not None
    assert run.state is None
    leases = PlanLeases(engine, interval_s=3600)  # renewed here, not by its thread
    try:
        # When its process renews the lease, then releases it
        leases.hold(workflow_id)
        time.sleep(0.05)
        assert leases.renew() == 1
        renewed = _deadline(engine, workflow_id)
        leases.release(workflow_id)
        assert leases.renew() == 0
    finally:
        leases.close()

    # Then each renewal dated it a lease ahead again; released, it is dated no further
    assert renewed > taken_at + timedelta(seconds=PLAN_LEASE_S)
    assert _deadline(engine, workflow_id) == renewed
    with engine.connect() as conn:
        status = conn.execute(
            select(workflow_table.c.status).where(workflow_table.c.id == workflow_id)
        ).scalar_one()
    assert status == "running"  # its trace shows it taken


def _deadline(engine: Engine, workflow_id: uuid.UUID) -> datetime:
    with engine.connect() as conn:
        query = select(run_table.c.next_deadline_at).where(run_table.c.workflow_id == workflow_id)
        deadline: datetime = conn.execute(query).scalar_one()
    return deadline
