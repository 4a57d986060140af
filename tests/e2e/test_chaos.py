"""Chaos: the distributed stack under steady load while its roles are killed -9 at random and
started again, and the broker's Redis is restarted empty once (issue 36).

Real ``conductor planner``, ``aggregator`` (two) and ``gateway`` (two) processes on the Redis
broker, a Redis of the test's own (restarted empty mid-run), the session's PostgreSQL, fake
providers on loopback whose request log counts the calls. At the end every workflow completed
or failed with a reason, none is stuck, and the provider calls made twice are at most the
calls in flight at the provider when a gateway was killed or Redis went down (the documented
bound: calls a dead gateway cut off are made again; nothing else is).

``CONDUCTOR_TEST_CHAOS_SEED`` replays a run's choice of kills (the seed is printed).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.test_distributed_stack import ULTRA, _client, _repeated_calls, _stack, plan_responder
from sqlalchemy import Connection, text

from conductor_adapters.store.db import make_engine
from conductor_adapters.store.runs import SubmitRequest, submit_workflow
from conductor_cli.local_stack import free_port

from fakes.brokers import private_redis_server
from fakes.openai_server import FakeOpenAIServer

pytestmark = [pytest.mark.postgres, pytest.mark.broker, pytest.mark.processes, pytest.mark.slow]

LOAD_S = 24.0  # steady submissions for this long
RATE_PER_S = 4.0
KILL_EVERY_S = 3.0
DRAIN_S = 60.0  # after the load, every workflow ends within this
ROLES = ["gateway-0", "gateway-1", "aggregator-0", "aggregator-1", "planner"]


@pytest.fixture
def fakes() -> Iterator[tuple[FakeOpenAIServer, FakeOpenAIServer]]:
    with (
        FakeOpenAIServer(responder=plan_responder) as planner,
        FakeOpenAIServer(latency_s=0.5) as workers,
    ):
        yield planner, workers


def test_steady_load_through_random_kills_and_a_redis_restart_ends_every_workflow(
    tmp_path: Path,
    fakes: tuple[FakeOpenAIServer, FakeOpenAIServer],
    postgres_url: str,
) -> None:
    seed = int(os.environ.get("CONDUCTOR_TEST_CHAOS_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"chaos seed {seed}")
    planner_fake, workers = fakes
    workers.latency_s = 0.5
    port = free_port()
    servers = [private_redis_server(port)]
    broker_url = f"redis://127.0.0.1:{port}/0"
    stack = _stack(
        tmp_path,
        (planner_fake, workers),
        database_url=postgres_url,
        broker_url=broker_url,
        redis_url=broker_url,
        redis_prefix="conductor:",
        gateways=2,
        aggregators=2,
        env={"CONDUCTOR_BROKER_VISIBILITY_TIMEOUT_S": "10"},
    )
    engine = make_engine(postgres_url)
    ids: list[uuid.UUID] = []
    kills: list[str] = []
    # Calls in flight at the provider when a gateway died or Redis went down: the bound
    in_flight_at_faults: list[int] = []
    restarted: list[str] = []
    done = threading.Event()
    # The supervisor must not start a role the chaos has just killed and is starting itself.
    starting = threading.Lock()

    def submit() -> None:
        app = _client(broker_url)
        started = time.monotonic()
        while time.monotonic() - started < LOAD_S:
            request = SubmitRequest(question=f"Question {len(ids)}: what is 1 + 1?", variant=ULTRA)
            workflow_id = uuid.uuid4()
            ids.append(workflow_id)
            # Redis down: the workflow is stored, and the sweeper sends its start again
            with contextlib.suppress(Exception):
                submit_workflow(engine, app, request, workflow_id=workflow_id)
            time.sleep(1 / RATE_PER_S)

    def chaos() -> None:
        started = time.monotonic()
        redis_restarted = False
        while not done.wait(KILL_EVERY_S) and time.monotonic() - started < LOAD_S:
            if not redis_restarted and time.monotonic() - started > LOAD_S / 2:
                redis_restarted = True
                in_flight_at_faults.append(workers.in_flight)
                kills.append("redis")
                servers[-1].kill()
                servers[-1].wait(timeout=10)
                time.sleep(1.0)
                servers.append(private_redis_server(port))
                continue
            name = rng.choice(ROLES)
            process = stack.get(name)
            with starting:
                if not process.running:
                    continue
                if name.startswith("gateway"):
                    in_flight_at_faults.append(workers.in_flight)
                kills.append(name)
                process.kill()
                time.sleep(rng.uniform(0.2, 1.0))
                process.start()

    def supervise() -> None:
        while not done.wait(1.0):
            with starting:
                restarted.extend(stack.restart_exited())

    stack.start()
    threads = [threading.Thread(target=t, daemon=True) for t in (submit, chaos, supervise)]
    try:
        for thread in threads:
            thread.start()
        threads[0].join()
        load_ended = time.monotonic()
        threads[1].join()
        deadline = time.monotonic() + DRAIN_S
        pending = set(ids)
        query = text(
            "SELECT workflow_id FROM workflow_run WHERE workflow_id = ANY(:ids) "
            "AND status IN ('completed', 'failed', 'cancelled')"
        )
        while pending and time.monotonic() < deadline:
            with engine.connect() as conn:
                pending -= set(conn.execute(query, {"ids": list(pending)}).scalars())
            time.sleep(0.5)
        drained_s = time.monotonic() - load_ended
        done.set()
        threads[2].join(timeout=10)
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, status, error FROM workflow WHERE id = ANY(:ids)"), {"ids": ids}
            ).all()
            stuck = _where_they_stand(conn, pending)
    finally:
        done.set()
        stack.stop()
        servers[-1].kill()
        servers[-1].wait(timeout=10)
        engine.dispose()

    repeated = _repeated_calls(workers)
    statuses = [row.status for row in rows]
    print(
        f"workflows: {len(ids)}, completed {statuses.count('completed')}, failed "
        f"{statuses.count('failed')}; faults: {kills}; processes that exited and were started "
        f"again: {restarted or 'none'}; all ended {drained_s:.1f} s after the load; provider "
        f"calls {len(workers.chat_requests)}, repeated {repeated}, bound "
        f"{sum(in_flight_at_faults)}"
    )
    # Then none is stuck: every workflow completed, or failed with its reason
    assert not pending, f"{len(pending)} of {len(ids)} workflows still running: {kills}\n{stuck}"
    assert len(rows) == len(ids)
    for row in rows:
        assert row.status in {"completed", "failed"}, row
        if row.status == "failed":
            assert row.error, row
    assert statuses.count("completed") >= 0.9 * len(ids), [r.error for r in rows]
    # and the provider was paid twice only for calls in flight when a gateway or Redis died
    assert repeated <= sum(in_flight_at_faults)
    assert "redis" in kills


def _where_they_stand(conn: Connection, pending: set[uuid.UUID]) -> str:
    """For a failure's message: each stuck workflow's run (the round it waits a plan for, its
    steps' sends, its next deadline) and its messages still in the outbox."""
    lines = []
    for workflow_id in sorted(pending, key=str):
        run = conn.execute(
            text(
                "SELECT status, next_deadline_at, state->'planning_round' AS planning_round, "
                "state->'plan_requests' AS plan_requests, state->'dispatches' AS dispatches "
                "FROM workflow_run WHERE workflow_id = :id"
            ),
            {"id": workflow_id},
        ).one_or_none()
        steps = conn.execute(
            text('SELECT "index", status FROM step WHERE workflow_id = :id ORDER BY "index"'),
            {"id": workflow_id},
        ).all()
        staged = conn.execute(
            text("SELECT task, created_at FROM outbox WHERE workflow_id = :id ORDER BY id"),
            {"id": workflow_id},
        ).all()
        lines.append(
            f"{workflow_id}: run {run._asdict() if run else None}; steps "
            f"{[tuple(step) for step in steps]}; outbox {[tuple(row) for row in staged]}"
        )
    return "\n".join(lines)
