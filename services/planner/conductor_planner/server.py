"""The ``conductor.v1.Planner`` gRPC service (grpc.aio), with health and reflection.

The port opens before the model loads, so orchestrators can probe health during a load that
takes seconds (llama.cpp) to minutes (vLLM): NOT_SERVING until the backend is ready, SERVING
after, NOT_SERVING again from the first moment of a graceful shutdown. Plan calls run
concurrently on the event loop; the backends batch or parallelise them, so there is no lock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from conductor.errors import ConductorError, ConfigurationError, InvalidRequest, WorkerError
from conductor.ports import PlannerBackend, PlanRequest
from conductor.variants import MAX_STEPS_LIMIT
from conductor_adapters.metrics_server import start_metrics_server
from conductor_adapters.rpc.planner_client import CHANNEL_OPTIONS, PLANNER_SERVICE
from conductor_adapters.rpc.planner_wire import outcome_to_proto, request_from_proto
from conductor_adapters.rpc.reflection import enable_reflection
from conductor_adapters.rpc.v1 import planner_pb2, planner_pb2_grpc
from conductor_adapters.settings import Settings
from conductor_planner.backends import create_backend
from conductor_planner.metrics import PlannerMetrics
from conductor_planner.planner import ConductorPlanner, load_router

log = logging.getLogger(__name__)

BackendFactory = Callable[[Settings], PlannerBackend]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_NAMES = (health.OVERALL_HEALTH, PLANNER_SERVICE)
DEFAULT_GRACE_S = 10.0
# grpc enables SO_REUSEPORT by default: a second planner on a busy port would then start
# "fine" and share its traffic. Off, a busy port is a clear error.
# Connections are closed (GOAWAY) after 5 minutes, the calls on them given 6 to finish (a plan
# may take CONDUCTOR_PLANNER_TIMEOUT_S, 300 s): clients then resolve the planner's name again,
# so planners added by a scale-up get their share of calls.
MAX_CONNECTION_AGE_MS = 300_000
MAX_CONNECTION_AGE_GRACE_MS = 360_000
SERVER_OPTIONS = (
    *CHANNEL_OPTIONS,
    ("grpc.so_reuseport", 0),
    ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
    ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
)


def request_problems(request: PlanRequest) -> list[str]:
    """What would make ConductorPlanner fail or plan nonsense; empty when the request is fine."""
    problems: list[str] = []
    workers = [i for i, entry in enumerate(request.pool) if not entry.is_conductor]
    if not request.question.strip():
        problems.append("question is empty")
    if not request.pool:
        problems.append("pool is empty")
    elif not workers:
        problems.append("pool has no worker, only Conductor entries")
    elif request.fallback_model_id not in workers:
        problems.append(
            f"fallback_model_id {request.fallback_model_id} is not a worker's position in the "
            f"pool (workers: {workers})"
        )
    if not 1 <= request.max_steps <= MAX_STEPS_LIMIT:
        problems.append(f"max_steps must be 1 to {MAX_STEPS_LIMIT}, got {request.max_steps}")
    workflow_max_steps = request.workflow_max_steps
    if workflow_max_steps is not None and not request.max_steps <= workflow_max_steps <= (
        MAX_STEPS_LIMIT
    ):
        problems.append(
            f"workflow_max_steps must be max_steps ({request.max_steps}) to {MAX_STEPS_LIMIT}, "
            f"got {workflow_max_steps}"
        )
    if request.round < 0:
        problems.append(f"round must be >= 0, got {request.round}")
    if request.max_tokens < 1:
        problems.append(f"max_tokens must be >= 1, got {request.max_tokens}")
    if not (math.isfinite(request.temperature) and 0 <= request.temperature <= 2):
        problems.append(f"temperature must be 0 to 2, got {request.temperature}")
    prior = request.prior
    if prior is not None and len(prior.answers) != len(prior.plan.steps):
        problems.append(f"prior has {len(prior.plan.steps)} steps but {len(prior.answers)} answers")
    return problems


async def _abort(context: Any, code: Any, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("unreachable: ServicerContext.abort raises")


class PlannerServicer(planner_pb2_grpc.PlannerServicer):  # type: ignore[misc]
    """``conductor.v1.Planner``; ``planner`` is None until the backend has loaded."""

    def __init__(
        self, planner: ConductorPlanner | None = None, metrics: PlannerMetrics | None = None
    ) -> None:
        self.planner = planner
        self.metrics = metrics

    async def Plan(self, request: Any, context: Any) -> Any:
        planner = self.planner
        if planner is None:
            await _abort(
                context, grpc.StatusCode.UNAVAILABLE, "the Conductor model is still loading"
            )
        try:
            plan_request = request_from_proto(request)
        except InvalidRequest as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        problems = request_problems(plan_request)
        if problems:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        started = time.perf_counter()
        try:
            outcome = await planner.plan(plan_request)
        except WorkerError as exc:  # the backend's model server (openai backend) failed
            self._failed(planner, started)
            log.warning("planner backend failed: %s", exc)
            code = grpc.StatusCode.UNAVAILABLE if exc.retryable else grpc.StatusCode.INTERNAL
            await _abort(context, code, f"planner backend failed: {exc}")
        except Exception as exc:
            self._failed(planner, started)
            log.exception("Plan failed")
            await _abort(
                context, grpc.StatusCode.INTERNAL, f"planner failed: {type(exc).__name__}: {exc}"
            )
        if self.metrics is not None:
            self.metrics.plan(outcome, time.perf_counter() - started)
        return planner_pb2.PlanResponse(call=outcome_to_proto(outcome))

    def _failed(self, planner: ConductorPlanner, started: float) -> None:
        if self.metrics is not None:
            self.metrics.failure(planner.backend.name, time.perf_counter() - started)


@dataclass
class PlannerServer:
    """A started planner server: where it listens, its health, and how to stop it."""

    server: Any  # grpc.aio.Server
    host: str
    port: int
    servicer: PlannerServicer
    health: Any  # grpc_health.v1.health.aio.HealthServicer
    grace_s: float = DEFAULT_GRACE_S
    backend: PlannerBackend | None = None
    load_error: Exception | None = None
    _loaded: asyncio.Event = field(default_factory=asyncio.Event)
    _load_task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references
    _stopped: bool = False

    @property
    def address(self) -> str:
        return _join(self.host, self.port)

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    async def wait_loaded(self) -> PlannerBackend:
        """The backend once loaded; raises the error that stopped it from loading."""
        await self._loaded.wait()
        if self.load_error is not None:
            raise self.load_error
        assert self.backend is not None
        return self.backend

    async def _load(self, factory: BackendFactory, settings: Settings) -> None:
        try:
            # In a thread: loading blocks (weights, CUDA), and health must answer meanwhile.
            router = await asyncio.to_thread(load_router, settings)  # a bad file: before the model
            backend = await asyncio.to_thread(factory, settings)
        except Exception as exc:
            self.load_error = exc
        else:
            self.backend = backend
            self.servicer.planner = ConductorPlanner(backend, router=router)
            metrics = self.servicer.metrics
            if metrics is not None and hasattr(backend, "on_batch"):  # backends that batch
                backend.on_batch = metrics.batch_size.labels(backend.name).observe
            for name in HEALTH_NAMES:  # ignored once a graceful shutdown has begun
                await self.health.set(name, SERVING)
        finally:
            self._loaded.set()

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING first (balancers stop sending), then let calls in flight finish within
        the grace period, then close the backend. A load still running is waited for, so its
        backend (e.g. vLLM's engine processes) is closed too."""
        if self._stopped:
            return
        self._stopped = True
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.grace_s if grace_s is None else grace_s)
        await self._loaded.wait()
        if self.backend is not None:
            await self.backend.aclose()


async def start_planner_server(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    backend_factory: BackendFactory | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    metrics: PlannerMetrics | None = None,
) -> PlannerServer:
    """Listen on host:port (0 picks a free port) and start loading the backend in a thread.

    Returns at once; ``wait_loaded()`` waits for the backend, ``stop()`` shuts down.
    """
    server = grpc.aio.server(options=SERVER_OPTIONS)
    servicer = PlannerServicer(metrics=metrics)
    planner_pb2_grpc.add_PlannerServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    for name in HEALTH_NAMES:
        await health_servicer.set(name, NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((PLANNER_SERVICE, health.SERVICE_NAME), server)
    try:
        bound: int = server.add_insecure_port(_join(host, port))
    except RuntimeError:
        raise ConfigurationError(
            f"cannot listen on {_join(host, port)}: the port is in use or the address is not "
            "this machine's; choose another --host/--port"
        ) from None
    await server.start()
    planner = PlannerServer(server, host, bound, servicer, health_servicer, grace_s)
    factory = backend_factory or create_backend
    planner._load_task = asyncio.create_task(planner._load(factory, settings))
    return planner


async def serve(
    settings: Settings,
    host: str,
    port: int,
    *,
    backend_factory: BackendFactory | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> int:
    """Run ``conductor planner`` until SIGTERM or SIGINT; returns the exit status.

    Prints one line when serving (scripts and tests wait for it) and exits 1, saying why, when
    the backend cannot load.
    """
    name = settings.planner_backend if backend_factory is None else "custom"
    metrics = PlannerMetrics()
    planner = await start_planner_server(
        settings, host, port, backend_factory=backend_factory, grace_s=grace_s, metrics=metrics
    )
    # Ready once the model has loaded, as the gRPC health service says.
    metrics_server = start_metrics_server(
        metrics.registry, settings.metrics_port, ready=lambda: planner.servicer.planner is not None
    )
    _say(f"listening on {planner.address}; loading planner backend {name} (NOT_SERVING)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for number in signals:
        loop.add_signal_handler(number, stop.set)
    stopping = asyncio.create_task(stop.wait())
    loading = asyncio.create_task(planner.wait_loaded())
    try:
        await asyncio.wait({stopping, loading}, return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            if (error := loading.exception()) is not None:
                reason = str(error) if isinstance(error, ConductorError) else repr(error)
                _say(f"error: planner backend {name} failed to load: {reason}")
                return 1
            backend = loading.result()
            _say(f"serving {PLANNER_SERVICE} on {planner.address} (backend {backend.name})")
            await stopping
        _say(f"stopping: NOT_SERVING, finishing calls in flight (grace {planner.grace_s:g} s)")
        return 0
    finally:
        for task in (stopping, loading):
            task.cancel()
        await planner.stop()
        if metrics_server is not None:
            metrics_server.stop()
        for number in signals:
            loop.remove_signal_handler(number)
        _say("stopped")


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _say(message: str) -> None:
    # Printed at any log level: operators and tests read these lines.
    print(f"conductor planner: {message}", file=sys.stderr, flush=True)
