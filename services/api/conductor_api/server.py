"""Runs the HTTP API (uvicorn) and the gRPC Workflows service in one event loop.

uvicorn handles SIGINT and SIGTERM: it stops accepting, lets requests in flight finish (up to
the grace period), then the gRPC server stops with the same grace and the service closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import grpc
import uvicorn

from conductor_adapters.metrics_server import MetricsServer
from conductor_adapters.rpc.guard import RequestGuard
from conductor_api.app import create_app
from conductor_api.grpc_service import add_workflows_service, mark_serving
from conductor_api.service import WorkflowService


@dataclass(frozen=True)
class Listening:
    http_url: str
    grpc_address: str | None
    metrics_url: str | None = None


@contextlib.contextmanager
def _signals_end(server: uvicorn.Server) -> Iterator[None]:
    """SIGINT and SIGTERM end the server; nothing more.

    uvicorn handles them while it serves, and afterwards raises the signal again under the
    handler that was installed before it: with Python's defaults that kills the process
    before gRPC and the service are closed. Ours asks for the same graceful exit instead.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals (servers in tests run on threads)
        return

    def end(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, end) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ready_check(service: WorkflowService, loop: asyncio.AbstractEventLoop) -> Callable[[], bool]:
    """The API's readiness for the metrics port's thread: asked on the server's loop."""

    def ready() -> bool:
        return asyncio.run_coroutine_threadsafe(service.readiness(), loop).result(10)[0]

    return ready


def _http_url(server: uvicorn.Server, host: str) -> str:
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://{host}:{port}"


async def serve_api(
    service: WorkflowService,
    *,
    host: str,
    port: int,
    grpc_port: int | None,
    open_access: bool = False,
    cors_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
    metrics_port: int | None = None,
    grace_s: float = 10.0,
    on_ready: Callable[[Listening], None] = lambda _: None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set, for servers on a thread); ``on_ready``
    hears where, once every port listens. ``metrics_port``: serve /metrics (every tenant's
    figures), /healthz and /readyz there too, for Prometheus (None: no such port)."""
    await service.start()
    grpc_server: grpc.aio.Server | None = None
    grpc_health: Any = None
    metrics_server: MetricsServer | None = None
    try:
        grpc_address = None
        if grpc_port is not None:
            grpc_server = grpc.aio.server(interceptors=[RequestGuard()])
            grpc_health = add_workflows_service(grpc_server, service, open_access=open_access)
            bound = grpc_server.add_insecure_port(f"{host}:{grpc_port}")
            await grpc_server.start()
            await mark_serving(grpc_health)
            grpc_address = f"{host}:{bound}"
        app = create_app(
            service,
            open_access=open_access,
            cors_origins=cors_origins,
            allowed_hosts=allowed_hosts,
        )
        metrics_url = None
        if metrics_port is not None:
            metrics_server = MetricsServer(
                service.metrics.registry,
                port=metrics_port,
                host=host,
                ready=_ready_check(service, asyncio.get_running_loop()),
            ).start()
            metrics_url = f"http://{host}:{metrics_server.port}"
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(grace_s),
        )
        server = uvicorn.Server(config)

        async def announce() -> None:
            while not server.started:
                if server.should_exit:
                    return
                await asyncio.sleep(0.05)
            on_ready(Listening(_http_url(server, host), grpc_address, metrics_url))

        async def stop_on_request() -> None:
            if stop is not None:
                await stop.wait()
                server.should_exit = True

        helpers = [asyncio.create_task(announce()), asyncio.create_task(stop_on_request())]
        with _signals_end(server):
            await server.serve()
        for task in helpers:
            task.cancel()
    finally:
        if metrics_server is not None:
            metrics_server.stop()
        if grpc_server is not None:
            if grpc_health is not None:  # health checks see the drain before it starts
                await grpc_health.enter_graceful_shutdown()
            await grpc_server.stop(grace_s)
        await service.aclose()
