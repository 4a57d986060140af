"""The composition root: the one place that builds runtimes from settings.

The core defines the ports (planner, step runner, observers); the services implement them; this
module picks the implementations a deployment uses and wires them together, so no service
imports another:

- the embedded runtime (``conductor ask``, ``conductor serve``): planner, workers, executor and
  trace store in one process;
- the distributed roles: a gateway process, an aggregator, the API in front of them;
- the offline jobs: the gateway and planner that ``conductor eval`` and ``conductor train`` use.

The distributed roles and the offline jobs import their services when they are built, so a
command loads only what it runs (``conductor ask`` never imports Celery or PyTorch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from conductor.executor import WorkflowExecutor
from conductor.pool import Pool, Provider, WorkerSpec
from conductor.ports import ChatWorker, PlannerBackend, WorkflowObserver
from conductor_adapters.llamacpp import EngineOptions
from conductor_adapters.settings import BrokerSettings, Settings, load_pool, load_variants
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.traces import TraceStore
from conductor_cli.timings import Timings
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.registry import build_workers
from conductor_planner import ConductorPlanner, load_router
from conductor_planner.backends import create_backend

if TYPE_CHECKING:
    from celery import Celery

    from conductor_aggregator.metrics import AggregatorMetrics
    from conductor_aggregator.service import Aggregator
    from conductor_aggregator.settings import AggregatorSettings
    from conductor_api.service import WorkflowService
    from conductor_evaluation.runner import EvalRuntime
    from conductor_gateway.metrics import GatewayMetrics


def secret_variables(pool: Pool, settings: Settings) -> list[str]:
    """The variables whose values never reach a trace: every key variable of the pool and the
    planner's (the store also blanks any variable whose name looks secret)."""
    names = [w.api_key_env for w in pool.workers if w.api_key_env]
    if settings.planner_api_key_env:
        names.append(settings.planner_api_key_env)
    return names


def workers_for(pool: Pool, settings: Settings) -> dict[str, ChatWorker]:
    """Clients for the pool's callable workers; blocking (a local worker loads its model).
    Simulated and replayed workers (providers ``sim``, ``replay``) come from the evaluation
    harness, which owns the items they answer."""
    from conductor_evaluation.replay import ReplayWorker
    from conductor_evaluation.sim import SimWorker

    providers: Mapping[Provider, Callable[[WorkerSpec], ChatWorker]] = {
        Provider.SIM: SimWorker.from_spec,
        Provider.REPLAY: ReplayWorker.from_spec,
    }
    return build_workers(pool, EngineOptions.from_settings(settings), providers=providers)


def in_process_gateway(pool: Pool, settings: Settings) -> WorkerGateway:
    """The gateway over the pool's workers in this process, quotas in memory; blocking."""
    return WorkerGateway.in_process(pool, workers_for(pool, settings))


def planner_backend(settings: Settings) -> PlannerBackend:
    """The configured planner backend with its model loaded; blocking."""
    return create_backend(settings)


# -- the embedded runtime ---------------------------------------------------------------------


@dataclass
class EmbeddedRuntime:
    executor: WorkflowExecutor
    store: TraceStore
    pool: Pool
    unavailable: list[tuple[WorkerSpec, str]]
    gateway: WorkerGateway
    engine: Engine
    backend: PlannerBackend
    _closed: bool = field(default=False)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.store.flush()  # progress written behind is committed before the engine goes
        await self.backend.aclose()
        await self.gateway.aclose()
        self.engine.dispose()


async def open_embedded_runtime(
    settings: Settings,
    observers: Sequence[WorkflowObserver] = (),
    timings: Timings | None = None,
) -> EmbeddedRuntime:
    """Migrate the trace database, load the models and connect the workers; ``timings``
    records how long each took."""
    timings = timings or Timings()
    pool = load_pool(settings)
    with timings.phase("migrate"):
        await asyncio.to_thread(upgrade, settings.database_url)
    db = make_engine(settings.database_url)
    try:
        with timings.phase("planner_load"):
            # The router first: a bad router file stops the start before the models load.
            router = await asyncio.to_thread(load_router, settings)
            backend = await asyncio.to_thread(planner_backend, settings)
        with timings.phase("workers_load"):
            gateway = await asyncio.to_thread(in_process_gateway, pool, settings)
    except BaseException:
        db.dispose()
        raise
    store = TraceStore(db, pool, secret_env_names=secret_variables(pool, settings))
    executor = WorkflowExecutor(
        planner=ConductorPlanner(backend, router=router),
        pool=pool,
        gateway=gateway,
        observers=[store, *observers],
    )
    return EmbeddedRuntime(
        executor=executor,
        store=store,
        pool=pool,
        unavailable=pool.unavailable(),
        gateway=gateway,
        engine=db,
        backend=backend,
    )


def embedded_api_service(runtime: EmbeddedRuntime, settings: Settings) -> WorkflowService:
    """The API's service over the embedded runtime (``conductor serve``)."""
    from conductor_api.embedded import EmbeddedRuntime as ApiRuntime
    from conductor_api.service import WorkflowService

    api_runtime = ApiRuntime(
        runtime.executor,
        runtime.gateway,
        runtime.store,
        runtime.pool,
        heartbeat_s=settings.runner_heartbeat_s,
        stale_after_s=settings.runner_stale_after_s,
    )
    return WorkflowService(api_runtime, load_variants(settings), settings.default_variant)


# -- the distributed roles --------------------------------------------------------------------


def gateway_celery(settings: Settings, metrics: GatewayMetrics | None = None) -> Celery:
    """The gateway role's Celery app; its process (Redis client, workers) is built on the first
    task, in the worker process."""
    from conductor_gateway.celery_app import GatewayProcess, create_celery
    from conductor_gateway.settings import GatewaySettings

    gateway_settings = GatewaySettings.load()

    def build() -> GatewayProcess:
        pool = load_pool(settings)
        return GatewayProcess(gateway_settings, pool, workers_for(pool, settings), metrics)

    return create_celery(gateway_settings, build)


def aggregator_celery(
    settings: Settings,
    aggregator_settings: AggregatorSettings,
    metrics: AggregatorMetrics | None = None,
) -> Celery:
    """The aggregator role's Celery app; the aggregator is built on first use."""
    from conductor_aggregator.celery_app import create_aggregator_celery

    return create_aggregator_celery(
        aggregator_settings,
        lambda app: build_aggregator(aggregator_settings, settings, app, metrics),
    )


def build_aggregator(
    aggregator_settings: AggregatorSettings,
    settings: Settings,
    app: Celery,
    metrics: AggregatorMetrics | None = None,
) -> Aggregator:
    """The production aggregator: PostgreSQL (waited for, its schema checked), the gRPC
    planner, Redis for event notices."""
    import redis

    from conductor_adapters.loop_thread import LoopThread
    from conductor_adapters.queue import broker_watch
    from conductor_adapters.rpc.planner_client import GrpcPlanner
    from conductor_adapters.store.db import check_schema, wait_for_database
    from conductor_adapters.store.traces import TraceWrites
    from conductor_aggregator.service import Aggregator

    wait_for_database(settings.database_url)
    check_schema(settings.database_url)
    pool = load_pool(settings)
    engine = make_engine(settings.database_url)
    timeout_s = aggregator_settings.planner_timeout_s
    return Aggregator(
        engine=engine,
        app=app,
        planner=GrpcPlanner(settings.planner_addr, timeout_s=timeout_s),
        loop=LoopThread("conductor-aggregator-loop"),
        pool=pool,
        writes=TraceWrites(
            engine.dialect.name,
            pool,
            secret_env_names=secret_variables(pool, settings),
            sole_writer=True,  # each change holds the run's lock; the API wrote the row
        ),
        redis_client=redis.Redis.from_url(aggregator_settings.redis_url),
        redis_prefix=aggregator_settings.redis_prefix,
        planner_timeout_s=timeout_s,
        broker_watch=broker_watch(aggregator_settings),
        metrics=metrics,
    )


def distributed_api_service(
    settings: Settings, broker: BrokerSettings, engine: Engine
) -> WorkflowService:
    """The API's service over the distributed runtime (``conductor api``): submissions and
    pass-through calls go through the broker, events are announced on Redis."""
    import redis.asyncio as aioredis

    from conductor_adapters.queue import new_celery_app
    from conductor_api.distributed import DistributedRuntime
    from conductor_api.key_limits import KeyLimiter
    from conductor_api.service import WorkflowService
    from conductor_gateway.client import QueuedStepRunner

    pool = load_pool(settings)
    app = new_celery_app("conductor_api", broker)
    redis = aioredis.Redis.from_url(broker.redis_url)
    runtime = DistributedRuntime(
        engine=engine,
        app=app,
        redis=redis,
        redis_prefix=broker.redis_prefix,
        runner=QueuedStepRunner(app, pool, redis, prefix=broker.redis_prefix),
        pool=pool,
        planner_addr=settings.planner_addr,
    )
    return WorkflowService(
        runtime,
        load_variants(settings),
        settings.default_variant,
        # Requests per minute counted in Redis: one window per key across every replica.
        limiter=KeyLimiter.on_redis(engine, broker.redis_url, broker.redis_prefix),
    )


# -- offline jobs -----------------------------------------------------------------------------


async def open_eval_runtime(
    settings: Settings, pool: Pool, *, with_planner: bool, step_timeout_s: float
) -> EvalRuntime:
    """What ``conductor eval`` runs strategies on: the pool's gateway and, when a Conductor
    variant is evaluated, its planner: the same parts ``conductor serve`` runs."""
    from conductor_evaluation.runner import EvalRuntime

    router = await asyncio.to_thread(load_router, settings) if with_planner else None
    gateway = await asyncio.to_thread(in_process_gateway, pool, settings)
    runtime = EvalRuntime(pool=pool, gateway=gateway, step_timeout_s=step_timeout_s)
    if with_planner:
        try:
            runtime.backend = await asyncio.to_thread(planner_backend, settings)
        except BaseException:
            await gateway.aclose()
            raise
        runtime.planner = ConductorPlanner(runtime.backend, router=router)
    return runtime


def redis_answers(url: str) -> Callable[[], bool]:
    """A readiness check: Redis (quotas, replies, event notices) answers a PING within 2 s."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return lambda: bool(client.ping())
