"""The distributed aggregator's own cost per workflow, without the broker and the other roles:
its message handlers called in this process as its Celery tasks call them, on a scratch
PostgreSQL database, with a scripted planner and a stand-in for Celery's ``send_task`` that
hands each message to the handler it names (a step's call is answered at once).

For one- and three-step workflows, run one at a time: this process's CPU per workflow
(``time.process_time``, so other jobs on the machine count far less than in the whole-stack
benchmark, orchestration_overhead.py), the SQL statements and transactions per workflow, and
the messages sent. Use it to compare commits: run it on each, in the same hour.

    python benchmarks/aggregator_messages.py [--workflows 300] [--postgres URL]
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from orchestration_overhead import scratch_database  # noqa: E402
from sqlalchemy import Engine, event  # noqa: E402

from conductor.chat import Usage  # noqa: E402
from conductor.machine import utcnow  # noqa: E402
from conductor.messaging import (  # noqa: E402
    CALL_WORKER_TASK,
    PLAN_ROUND_TASK,
    CallReply,
    CallRequest,
)
from conductor.pool import Pool, Price, Provider, WorkerSpec  # noqa: E402
from conductor.ports import StepCallResult  # noqa: E402
from conductor.variants import BUILTIN_VARIANTS  # noqa: E402
from conductor.workflow import AttemptRecord, WorkflowStatus  # noqa: E402
from conductor_adapters.loop_thread import LoopThread  # noqa: E402
from conductor_adapters.store.db import make_engine  # noqa: E402
from conductor_adapters.store.runs import SubmitRequest, load_run, record_submission  # noqa: E402
from conductor_adapters.store.traces import TraceWrites  # noqa: E402
from conductor_aggregator.service import Aggregator  # noqa: E402
from conductor_planner import ConductorPlanner  # noqa: E402

from fakes.scripted import ScriptedBackend, lists  # noqa: E402

POOL = Pool(
    workers=tuple(
        WorkerSpec(
            name=name,
            provider=Provider.OPENAI_COMPATIBLE,
            model=name,
            base_url="http://127.0.0.1:9",
            price=Price(input=1.0, output=2.0),
        )
        for name in ("fast", "strong")
    )
)
# As the aggregator's wiring builds its trace writes (older commits lack the option).
SOLE_WRITER = (
    {"sole_writer": True} if "sole_writer" in inspect.signature(TraceWrites).parameters else {}
)
PLANS = {
    1: lists([0], ["Answer the question."], [[]]),
    3: lists([0, 1, 0], ["Solve.", "Check.", "Answer."], [[], ["all"], ["all"]]),
}


class Counting:
    """Counts the statements and transactions an engine runs."""

    def __init__(self, engine: Engine) -> None:
        self.statements = 0
        self.commits = 0
        self.on = False
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, *_: Any) -> None:
        self.statements += self.on

    def _commit(self, *_: Any) -> None:
        self.commits += self.on


class InlineApp:
    """Celery's ``send_task`` for the aggregator: each message goes to the queue of this
    process, which the driver empties in order (as one worker thread would)."""

    def __init__(self) -> None:
        self.queue: list[tuple[str, list[Any]]] = []
        self.sent: Counter[str] = Counter()

    def send_task(self, name: str, *, args: list[Any], queue: str, **_: Any) -> None:
        self.queue.append((name, args))
        self.sent[name] += 1


def answer(call: dict[str, Any]) -> CallReply:
    request = CallRequest.model_validate(call)
    usage = Usage(prompt_tokens=12, completion_tokens=3)
    attempt = AttemptRecord(
        number=1, worker=request.worker, status="ok", usage=usage, cost_usd=1e-5,
        started_at=utcnow(),
    )  # fmt: skip
    result = StepCallResult(
        text="42", worker=request.worker, usage=usage, cost_usd=1e-5, attempts=[attempt]
    )
    return CallReply(
        call_id=request.call_id, ok=True, result=result, attempts=[attempt],
        context=request.context,
    )  # fmt: skip


def run_workflow(
    aggregator: Aggregator, app: InlineApp, engine: Engine, counting: Counting
) -> uuid.UUID:
    workflow_id = uuid.uuid4()
    variant = BUILTIN_VARIANTS["conductor-ultra"]
    counting.on = False
    with engine.begin() as conn:  # what the API does: not the aggregator's
        record_submission(conn, SubmitRequest(question="What is 6 * 7?", variant=variant),
                          workflow_id, utcnow())  # fmt: skip
    counting.on = True
    aggregator.start(workflow_id)
    while app.queue:
        name, args = app.queue.pop(0)
        if name == PLAN_ROUND_TASK:
            aggregator.plan(uuid.UUID(args[0]), args[1])
        elif name == CALL_WORKER_TASK:
            aggregator.step_result(answer(args[0]))
    return workflow_id


def measure(engine: Engine, steps: int, workflows: int) -> dict[str, float]:
    loop = LoopThread("bench-aggregator-loop")
    app = InlineApp()
    planner = ConductorPlanner(ScriptedBackend(outputs=[PLANS[steps]] * (workflows + 5)))
    aggregator = Aggregator(
        engine=engine, app=app, planner=planner, loop=loop, pool=POOL,  # type: ignore[arg-type]
        writes=TraceWrites("postgresql", POOL, **SOLE_WRITER),
    )  # fmt: skip
    try:
        counting = Counting(engine)
        for _ in range(5):  # warm-up: connections, statement caches
            run_workflow(aggregator, app, engine, counting)
        counting.statements = counting.commits = 0
        app.sent.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        last = uuid.uuid4()
        for _ in range(workflows):
            last = run_workflow(aggregator, app, engine, counting)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        counting.on = False
        if hasattr(aggregator, "sent_rows"):
            aggregator.sent_rows.flush()
        statements, commits = counting.statements, counting.commits
        with engine.connect() as conn:
            run = load_run(conn, last)
        if run is None or run.state is None or run.state.result.status != WorkflowStatus.COMPLETED:
            raise SystemExit(f"the last workflow did not complete: {run}")
    finally:
        aggregator.close()
    return {
        "cpu_ms": cpu * 1000 / workflows,
        "wall_ms": wall * 1000 / workflows,
        # The rows of sent messages are deleted by a thread of their own, in batches: a few of
        # those deletes may fall in the counted time.
        "statements": statements / workflows,
        "transactions": commits / workflows,
        "messages": sum(app.sent.values()) / workflows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "CONDUCTOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1/postgres"
        ),
    )
    options = parser.parse_args()
    with scratch_database(options.postgres) as url:
        engine = make_engine(url)
        try:
            for steps in (1, 3):
                row = measure(engine, steps, options.workflows)
                print(
                    f"{steps}-step workflow: CPU {row['cpu_ms']:6.2f} ms  wall "
                    f"{row['wall_ms']:6.2f} ms  statements {row['statements']:5.1f}  "
                    f"transactions {row['transactions']:4.1f}  messages {row['messages']:4.1f}"
                    "  (per workflow)",
                    flush=True,
                )
        finally:
            engine.dispose()


if __name__ == "__main__":
    main()
