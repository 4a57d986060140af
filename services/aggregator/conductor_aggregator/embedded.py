"""The embedded runtime: planner, workers, executor and trace store in one process.

This is the zero-set-up mode (``conductor ask``, ``conductor serve``): SQLite by default, the
planner and the local worker on the in-process llama.cpp engine, cloud workers over HTTPS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Engine

from conductor.llamacpp import EngineOptions
from conductor.pool import Pool, WorkerSpec
from conductor.ports import PlannerBackend, WorkflowObserver
from conductor.settings import Settings, load_pool
from conductor.traces.db import make_engine, upgrade
from conductor.traces.store import TraceStore
from conductor_aggregator.executor import WorkflowExecutor
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.registry import build_workers
from conductor_planner import ConductorPlanner
from conductor_planner.backends import create_backend


@dataclass
class EmbeddedRuntime:
    executor: WorkflowExecutor
    store: TraceStore
    pool: Pool
    unavailable: list[tuple[WorkerSpec, str]]
    _backend: PlannerBackend
    gateway: WorkerGateway
    engine: Engine
    _closed: bool = field(default=False)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._backend.aclose()
        await self.gateway.aclose()
        self.engine.dispose()


async def open_embedded_runtime(
    settings: Settings, observers: Sequence[WorkflowObserver] = ()
) -> EmbeddedRuntime:
    """Migrate the trace database, load the models and connect the workers."""
    pool = load_pool(settings)
    await asyncio.to_thread(upgrade, settings.database_url)
    db = make_engine(settings.database_url)
    try:
        backend = await asyncio.to_thread(create_backend, settings)
        options = EngineOptions.from_settings(settings)
        workers = await asyncio.to_thread(build_workers, pool, options)
    except BaseException:
        db.dispose()
        raise
    key_variables = [w.api_key_env for w in pool.workers if w.api_key_env]
    if settings.planner_api_key_env:
        key_variables.append(settings.planner_api_key_env)
    store = TraceStore(db, secret_env_names=key_variables)
    gateway = WorkerGateway.in_process(pool, workers)
    executor = WorkflowExecutor(
        planner=ConductorPlanner(backend),
        pool=pool,
        gateway=gateway,
        observers=[store, *observers],
    )
    return EmbeddedRuntime(
        executor=executor,
        store=store,
        pool=pool,
        unavailable=pool.unavailable(),
        _backend=backend,
        gateway=gateway,
        engine=db,
    )
