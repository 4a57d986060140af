"""Every provider call that may be billed has an attempt row, also when its step was cancelled
with its workflow (issue 36 #12: calls answered 429 in a storm had none).

A fake OpenAI-compatible provider on loopback answers every call 429 with a short Retry-After,
so the step's call retries; the workflow is cancelled while it does. The trace must then hold
one attempt row per request the provider received, on the cancelled step, on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import Engine

from conductor.executor import WorkflowExecutor
from conductor.machine import Cancelled
from conductor.pool import Pool
from conductor.variants import BUILTIN_VARIANTS
from conductor.workflow import StepKind, StepStatus, WorkflowStatus
from conductor_adapters.store.traces import TraceStore
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.registry import build_workers
from conductor_gateway.retry import RetryPolicy
from conductor_planner import ConductorPlanner

from fakes.api_server import TwoStepBackend
from fakes.openai_server import FakeOpenAIServer, error, openai_compatible_spec

STORM = 200  # more 429s than the step lives to ask for


async def test_calls_of_a_cancelled_step_are_in_the_trace(
    engine: Engine, fake_openai: FakeOpenAIServer
) -> None:
    # Given a provider in a storm of 429s, and a workflow whose one step calls it
    rate_limited = error(429, "Rate limit reached", headers={"Retry-After": "0.05"})
    fake_openai.enqueue(*[rate_limited] * STORM)
    pool = Pool(workers=(openai_compatible_spec("alpha", fake_openai.base_url),))
    policy = RetryPolicy(max_attempts=STORM, base_delay_s=0.01, max_delay_s=0.05)
    gateway = WorkerGateway(pool, build_workers(pool), policy=policy)
    store = TraceStore(engine, pool)
    executor = WorkflowExecutor(
        planner=ConductorPlanner(TwoStepBackend()), pool=pool, gateway=gateway, observers=[store]
    )
    workflow_id = uuid.uuid4()
    run = asyncio.create_task(
        executor.run("What is 6*7?", BUILTIN_VARIANTS["conductor-ultra"], workflow_id=workflow_id)
    )
    try:
        # When it is cancelled while the step's call is being retried
        for _ in range(500):
            if len(fake_openai.chat_requests) >= 3:
                break
            await asyncio.sleep(0.01)
        assert len(fake_openai.chat_requests) >= 3
        run.cancel(Cancelled("cancelled by the test"))
        await asyncio.gather(run, return_exceptions=True)
        await store.flush()
    finally:
        await gateway.aclose()

    # Then the workflow is cancelled, and its step has one attempt row per call received
    stored = await store.get_workflow(workflow_id)
    assert stored is not None
    assert stored.status == WorkflowStatus.CANCELLED.value
    steps = [s for s in await store.list_steps(workflow_id) if s.kind == StepKind.WORKER.value]
    assert len(steps) == 1
    assert steps[0].status == StepStatus.CANCELLED.value
    attempts = await store.list_attempts(steps[0].id)
    received = len(fake_openai.chat_requests)
    assert [a.number for a in attempts] == list(range(1, received + 1))
    answered = [a for a in attempts if a.status_code is not None]
    assert answered, attempts
    assert all(a.status_code == 429 and a.worker == "alpha" for a in answered)
    # At most the call in flight at the cancel has no answer recorded.
    assert len(attempts) - len(answered) <= 1
