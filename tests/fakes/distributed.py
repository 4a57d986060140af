"""The distributed runtime inside the test process, for the executor's behavioural tests.

Everything between the parts is real: the Redis broker (a key prefix per test module), the
planner's gRPC server on loopback, PostgreSQL with row locks, Celery workers consuming the
``aggregator`` and ``gateway.*`` queues. Only the models are scripted, and the workers run on
threads of this process so a test can swap its scripted planner backend and workers in.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from sqlalchemy import Engine

from conductor.chat import ChatMessage, Completion
from conductor.messaging import AGGREGATOR_QUEUE
from conductor.pool import Pool
from conductor.ports import ChatWorker, PlanFormat, PlannerBackend, PromptForm
from conductor.variants import Variant
from conductor.workflow import WorkflowRecord
from conductor_adapters.loop_thread import LoopThread
from conductor_adapters.periodic import Periodic
from conductor_adapters.rpc.planner_client import GrpcPlanner
from conductor_adapters.settings import Settings
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.runs import SubmitRequest, load_run, submit_workflow
from conductor_adapters.store.traces import TraceWrites
from conductor_aggregator.celery_app import create_aggregator_celery
from conductor_aggregator.service import Aggregator
from conductor_aggregator.settings import AggregatorSettings
from conductor_gateway.celery_app import GatewayProcess, register_gateway_tasks
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.quotas import MemoryQuotas
from conductor_gateway.retry import RetryPolicy
from conductor_gateway.settings import GatewaySettings
from conductor_planner.server import PlannerServer, start_planner_server

GATEWAY_QUEUES = ["gateway.openai-compatible", "gateway.openai", "gateway.llamacpp"]


class SwitchableBackend:
    """A planner backend that forwards to whichever backend the current test set."""

    name = "switchable"

    def __init__(self) -> None:
        self.current: PlannerBackend | None = None

    @property
    def plan_format(self) -> PlanFormat:
        assert self.current is not None, "no planner backend set for this test"
        return self.current.plan_format

    @property
    def prompt_form(self) -> PromptForm:
        assert self.current is not None, "no planner backend set for this test"
        return self.current.prompt_form

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        assert self.current is not None, "no planner backend set for this test"
        return await self.current.generate(
            messages, json_schema=json_schema, max_tokens=max_tokens, temperature=temperature
        )

    async def aclose(self) -> None:
        return None


class DistributedStack:
    """Planner server, aggregator and gateway workers, sharing one database and broker."""

    def __init__(self, database_url: str, redis_url: str, prefix: str) -> None:
        self.database_url = database_url
        self.engine: Engine = make_engine(database_url)
        self.backend = SwitchableBackend()
        self.planner_loop = LoopThread("test-planner-loop")
        self.planner_server: PlannerServer = self.planner_loop.run(
            start_planner_server(Settings(), port=0, backend_factory=lambda _: self.backend)
        )
        self.planner_loop.run(self.planner_server.wait_loaded())
        broker = {
            "broker_url": redis_url,
            "redis_url": redis_url,
            "redis_prefix": prefix,
        }
        self.gateway_settings = GatewaySettings(**broker)
        self.gateway_process: GatewayProcess | None = None
        self.aggregator: Aggregator | None = None
        # One app and one worker for both roles: Celery's in-thread test worker stops through
        # process-wide state, which two workers in one process do not share reliably.
        self.app: Celery = create_aggregator_celery(
            AggregatorSettings(**broker), build=self._aggregator
        )
        register_gateway_tasks(self.app, self.gateway_settings, build=self._gateway_process)
        self._pool: Pool | None = None
        self._workers: Mapping[str, ChatWorker] = {}

    # -- what a test swaps in ----------------------------------------------------------------

    def configure(
        self, backend: PlannerBackend, pool: Pool, workers: Mapping[str, ChatWorker]
    ) -> None:
        self.backend.current = backend
        self._pool, self._workers = pool, workers
        gateway = self._gateway()
        if self.gateway_process is not None:
            self.gateway_process.gateway = gateway
        if self.aggregator is not None:
            self.aggregator.pool = pool
            self.aggregator.writes = TraceWrites("postgresql", pool)

    def _gateway(self) -> WorkerGateway:
        assert self._pool is not None
        return WorkerGateway(
            self._pool,
            self._workers,
            quotas=MemoryQuotas(self.gateway_settings.quota_config()),
            policy=RetryPolicy(max_attempts=1, base_delay_s=0.0),
        )

    def _gateway_process(self) -> GatewayProcess:
        assert self._pool is not None
        self.gateway_process = GatewayProcess(self.gateway_settings, self._pool, self._workers)
        self.gateway_process.gateway = self._gateway()
        return self.gateway_process

    def _aggregator(self, app: Celery) -> Aggregator:
        assert self._pool is not None
        self.aggregator = Aggregator(
            engine=make_engine(self.database_url),
            app=app,
            planner=GrpcPlanner(self.planner_server.address, timeout_s=30),
            loop=LoopThread("test-aggregator-loop"),
            pool=self._pool,
            writes=TraceWrites("postgresql", self._pool),
            redis_client=redis.Redis.from_url(self.gateway_settings.redis_url),
            redis_prefix=self.gateway_settings.redis_prefix,
        )
        return self.aggregator

    # -- running workflows -------------------------------------------------------------------

    async def run(
        self, question: str, variant: Variant, *, timeout_s: float = 20.0
    ) -> WorkflowRecord:
        """Submit through the queue and wait until the aggregator finishes the workflow."""
        request = SubmitRequest(question=question, variant=variant)
        workflow_id = await asyncio.to_thread(submit_workflow, self.engine, self.app, request)
        return await self.wait(workflow_id, timeout_s=timeout_s)

    async def wait(self, workflow_id: uuid.UUID, *, timeout_s: float = 20.0) -> WorkflowRecord:
        deadline = time.monotonic() + timeout_s
        while True:
            with self.engine.connect() as conn:
                run = load_run(conn, workflow_id)
            if run is not None and run.state is not None and run.state.finished:
                return run.state.result
            if time.monotonic() > deadline:
                status = run.status if run else "missing"
                state = run.state.model_dump_json(indent=1) if run and run.state else ""
                raise AssertionError(
                    f"workflow {workflow_id} still {status} after {timeout_s} s:\n{state}"
                )
            await asyncio.sleep(0.05)

    def sweep(self) -> None:
        if self.aggregator is not None:
            self.aggregator.sweep()

    def close(self) -> None:
        if self.aggregator is not None:
            self.aggregator.close()
        if self.gateway_process is not None:
            self.gateway_process.close()
        self.planner_loop.run(self.planner_server.stop(0))
        self.planner_loop.stop()
        self.engine.dispose()


@contextmanager
def distributed_stack(database_url: str, redis_url: str, prefix: str) -> Iterator[DistributedStack]:
    """Migrate the database, start the servers and both Celery workers; stop them after."""
    upgrade(database_url)
    stack = DistributedStack(database_url, redis_url, prefix)
    # As an aggregator process runs it: deadlines, lost messages, webhooks due.
    sweeping = Periodic("test-sweeper", stack.sweep, 0.5).start()
    try:
        with start_worker(
            stack.app,
            pool="threads",
            # Enough threads for a hundred calls waiting on a worker's quota (the fairness
            # tests) beside the aggregator's tasks.
            concurrency=160,
            perform_ping_check=False,
            loglevel="WARNING",
            queues=[AGGREGATOR_QUEUE, *GATEWAY_QUEUES],
            shutdown_timeout=30,
        ):
            yield stack
    finally:
        sweeping.stop()
        stack.close()
