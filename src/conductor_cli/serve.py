"""``conductor serve`` (embedded, all in one process) and ``conductor api`` (distributed)."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

import typer

from conductor.errors import ConfigurationError
from conductor_cli.server_process import run_event_loop, settle_garbage_collector

if TYPE_CHECKING:  # imported lazily at run time: the API pulls in FastAPI, uvicorn and gRPC
    from conductor_api.server import Listening

HOST_HELP = "Address to listen on (0.0.0.0: all)."
GRPC_HELP = "Port of the gRPC Workflows service (0: any free port; -1: none)."


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help=HOST_HELP),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="HTTP port."),
    grpc_port: int = typer.Option(50052, "--grpc-port", min=-1, max=65535, help=GRPC_HELP),
) -> None:
    """Serve the API with everything in this process (the embedded runtime).

    While no API key exists the server is open (tenant "default") and only listens on a
    loopback address; once `conductor keys create` made a key, every request needs one.
    """
    from conductor_adapters.settings import get_settings, load_variants
    from conductor_adapters.store.db import make_engine, upgrade
    from conductor_adapters.store.keys import any_key_exists
    from conductor_adapters.webhooks import allowed_networks

    settings = get_settings()
    load_variants(settings)  # a bad variants file fails here, before the models load
    allowed_networks()  # and a bad CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS, not at a submission
    upgrade(settings.database_url)
    probe = make_engine(settings.database_url)
    try:
        open_access = not any_key_exists(probe)
    finally:
        probe.dispose()
    if open_access and not _is_loopback(host):
        raise ConfigurationError(
            f"no API key exists, so the server would be open: it listens on {host} only once "
            "a key exists (`conductor keys create --tenant NAME`); or use --host 127.0.0.1"
        )
    typer.echo(
        "conductor serve: no API key exists: open to local clients as tenant 'default' "
        "until `conductor keys create` makes one"
        if open_access
        else "conductor serve: API keys required"
    )

    async def run() -> None:
        from conductor_api.server import serve_api
        from conductor_cli.wiring import embedded_api_service, open_embedded_runtime

        runtime = await open_embedded_runtime(settings)
        for spec, reason in runtime.unavailable:
            typer.echo(f"conductor serve: worker {spec.name} unavailable: {reason}")
        service = embedded_api_service(runtime, settings)
        settle_garbage_collector()
        try:
            await serve_api(
                service,
                host=host,
                port=port,
                grpc_port=None if grpc_port < 0 else grpc_port,
                open_access=open_access,
                cors_origins=settings.cors_origins,
                allowed_hosts=settings.allowed_hosts,
                metrics_port=settings.metrics_port,
                on_ready=lambda at: _ready("serve", at),
            )
        finally:
            await runtime.aclose()

    run_event_loop(run())
    typer.echo("conductor serve: stopped")


def api(
    host: str = typer.Option("127.0.0.1", "--host", help=HOST_HELP),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="HTTP port."),
    grpc_port: int = typer.Option(50052, "--grpc-port", min=-1, max=65535, help=GRPC_HELP),
) -> None:
    """Serve the API of the distributed runtime: workflows go to the aggregators through the
    broker (CONDUCTOR_BROKER_URL). Needs PostgreSQL and at least one API key."""
    from conductor_adapters.settings import (
        BrokerSettings,
        get_settings,
        load_pool,
        load_settings,
        load_variants,
    )
    from conductor_adapters.store.db import check_schema, make_engine, wait_for_database
    from conductor_adapters.store.keys import any_key_exists
    from conductor_adapters.webhooks import allowed_networks

    settings = get_settings()
    broker = load_settings(BrokerSettings)
    if not broker.broker_url:
        raise ConfigurationError(
            "conductor api serves the distributed runtime: set CONDUCTOR_BROKER_URL "
            "(or run `conductor serve` for the embedded one)"
        )
    # A bad variants or pool file (or webhook networks) fails here, before anything connects.
    load_variants(settings)
    load_pool(settings)
    allowed_networks()
    wait_for_database(settings.database_url)
    check_schema(settings.database_url)
    engine = make_engine(settings.database_url)
    if not any_key_exists(engine):
        engine.dispose()
        raise ConfigurationError(
            "no API key exists and the distributed API never runs open: create one with "
            "`conductor keys create --tenant NAME`"
        )

    async def run() -> None:
        from conductor_api.server import serve_api
        from conductor_cli.wiring import distributed_api_service

        service = distributed_api_service(settings, broker, engine)
        settle_garbage_collector()
        await serve_api(
            service,
            host=host,
            port=port,
            grpc_port=None if grpc_port < 0 else grpc_port,
            cors_origins=settings.cors_origins,
            allowed_hosts=settings.allowed_hosts,
            metrics_port=settings.metrics_port,
            on_ready=lambda at: _ready("api", at),
        )

    try:
        run_event_loop(run())
    finally:
        engine.dispose()
    typer.echo("conductor api: stopped")


def _ready(role: str, at: Listening) -> None:
    grpc_part = f", gRPC on {at.grpc_address}" if at.grpc_address else ""
    metrics_part = f", metrics on {at.metrics_url}/metrics" if at.metrics_url else ""
    typer.echo(f"conductor {role}: serving on {at.http_url}{grpc_part}{metrics_part}", err=False)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
