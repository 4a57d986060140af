"""``conductor stack``: the whole distributed stack on this machine, as processes."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import typer


def stack(
    aggregators: int = typer.Option(1, "--aggregators", min=1, help="Aggregator processes."),
    gateways: int = typer.Option(1, "--gateways", min=1, help="Gateway processes."),
    planner_port: int = typer.Option(50051, "--planner-port", min=1, max=65535),
    log_dir: str | None = typer.Option(
        None, "--log-dir", help="Where each process logs. Default: DATA_DIR/stack-logs."
    ),
) -> None:
    """Run the planner, aggregators and gateways against the local Redis and PostgreSQL.

    Defaults: broker and Redis at redis://127.0.0.1:6379/0, database
    postgresql+psycopg://postgres@127.0.0.1:5432/conductor (created and migrated if needed);
    set CONDUCTOR_BROKER_URL, CONDUCTOR_REDIS_URL or CONDUCTOR_DATABASE_URL to use others.
    Submit work with `conductor ask --distributed "QUESTION"`. Ctrl-C (or SIGTERM) stops every
    process cleanly. A process that exits is started again; one that exits 5 times within a
    minute stops the stack with the end of its log.
    """
    from conductor.errors import ProcessStartError
    from conductor_adapters.settings import default_data_dir
    from conductor_adapters.store.db import ensure_database, redact_url, upgrade
    from conductor_cli.local_stack import LocalStack, engine_threads, local_stack_env

    env = local_stack_env()
    engines = _llamacpp_engines(gateways)
    if engines and "CONDUCTOR_LLAMACPP_THREADS" not in os.environ:
        env["CONDUCTOR_LLAMACPP_THREADS"] = str(engine_threads(engines))
        typer.echo(
            f"conductor stack: {engines} llama.cpp engines, "
            f"{env['CONDUCTOR_LLAMACPP_THREADS']} thread(s) each (CONDUCTOR_LLAMACPP_THREADS)",
            err=True,
        )
    database = env["CONDUCTOR_DATABASE_URL"]
    ensure_database(database)
    upgrade(database)
    logs = Path(log_dir) if log_dir else default_data_dir() / "stack-logs"
    local = LocalStack(
        logs, env, planner_port=planner_port, aggregators=aggregators, gateways=gateways
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    typer.echo(f"conductor stack: starting; logs in {logs}", err=True)
    local.start()
    typer.echo(
        f"conductor stack: ready: planner on 127.0.0.1:{planner_port}, {aggregators} "
        f"aggregator(s), {gateways} gateway(s); broker {redact_url(env['CONDUCTOR_BROKER_URL'])}, "
        f'database {redact_url(database)}. Try: conductor ask --distributed "What is 17 * 23?"',
        err=True,
    )
    failure = None
    while not stop.wait(1.0):
        try:
            for name in local.restart_exited():
                typer.echo(f"conductor stack: {name} exited and was started again", err=True)
        except ProcessStartError as exc:
            failure = exc
            break
    local.stop()
    if failure is not None:
        typer.echo(f"conductor stack: {failure}", err=True)
        raise typer.Exit(1)
    typer.echo("conductor stack: stopped", err=True)


def _llamacpp_engines(gateways: int) -> int:
    """How many processes of the stack load a llama.cpp engine: the planner on the llamacpp
    backend, and every gateway when the pool has a local worker."""
    from conductor.pool import Provider
    from conductor_adapters.settings import get_settings, load_pool

    settings = get_settings()
    planner = settings.planner_backend == "llamacpp"
    local = any(w.provider is Provider.LLAMACPP for w in load_pool(settings).available())
    return int(planner) + (gateways if local else 0)
