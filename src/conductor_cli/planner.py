"""``conductor planner``: the Conductor model behind the ``conductor.v1.Planner`` gRPC service."""

from __future__ import annotations

import asyncio

import typer

from conductor.errors import ConfigurationError


def planner(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: all)."),
    port: int | None = typer.Option(
        None,
        "--port",
        min=0,
        max=65535,
        help="Port to listen on. Default: the port of CONDUCTOR_PLANNER_ADDR (50051).",
    ),
    grace: float = typer.Option(
        10.0, "--grace", min=0, help="Seconds calls in flight may take to finish on SIGTERM."
    ),
) -> None:
    """Serve the Conductor planner over gRPC, with health checks and server reflection.

    The backend comes from CONDUCTOR_PLANNER_BACKEND (llamacpp, openai, transformers, vllm).
    Health reports NOT_SERVING while the model loads, SERVING once it can plan.
    """
    from conductor_adapters.settings import get_settings
    from conductor_cli.wiring import planner_backend
    from conductor_planner.server import serve

    settings = get_settings()
    port = _port_of(settings.planner_addr) if port is None else port
    code = asyncio.run(serve(settings, host, port, backend_factory=planner_backend, grace_s=grace))
    raise typer.Exit(code)


def _port_of(address: str) -> int:
    _, _, port = address.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(
            f"invalid setting: CONDUCTOR_PLANNER_ADDR {address!r} is not host:port"
        )
    return int(port)
