"""``conductor gateway``: a worker-gateway process consuming the ``gateway.<vendor>`` queues."""

from __future__ import annotations

import os
import socket
import sys

import typer


def gateway(
    queues: str | None = typer.Option(
        None,
        "--queues",
        "-Q",
        help="Comma-separated queues, e.g. gateway.openai,gateway.anthropic. "
        "Default: the queue of every vendor in the pool that can be called here.",
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", "-c", min=1, help="Calls in flight (CONDUCTOR_GATEWAY_CONCURRENCY)."
    ),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l"),
) -> None:
    """Run a worker gateway: provider calls with retries, shared quotas and cost accounting.

    Needs CONDUCTOR_BROKER_URL (Redis or RabbitMQ) and CONDUCTOR_REDIS_URL (shared quotas and
    replies). Every replica reads the same pool file (CONDUCTOR_POOL_FILE) and key variables.
    """
    from celery.signals import worker_ready

    from conductor.messaging import queue_for
    from conductor_adapters.metrics_server import start_metrics_server
    from conductor_adapters.settings import get_settings, load_pool
    from conductor_cli.celery_worker import run_worker
    from conductor_cli.wiring import gateway_celery, redis_answers
    from conductor_gateway.celery_app import shutdown
    from conductor_gateway.metrics import GatewayMetrics
    from conductor_gateway.settings import GatewaySettings

    settings = GatewaySettings.load()
    metrics = GatewayMetrics()
    app = gateway_celery(get_settings(), metrics)
    server = start_metrics_server(
        metrics.registry, get_settings().metrics_port, ready=redis_answers(settings.redis_url)
    )
    if queues is None:
        pool = load_pool(get_settings())
        queues = ",".join(sorted({queue_for(w) for w in pool.available()}))
    argv = [
        "worker",
        "--pool=threads",
        f"--concurrency={concurrency or settings.gateway_concurrency}",
        f"--queues={queues}",
        f"--loglevel={loglevel}",
        f"--hostname=gateway-{os.getpid()}@{socket.gethostname()}",
        "--without-gossip",
        "--without-mingle",
    ]

    def announce(**_: object) -> None:
        # Printed at any log level: scripts and tests wait for this line.
        print(f"conductor gateway: ready, consuming {queues}", file=sys.stderr, flush=True)

    worker_ready.connect(announce, weak=False)
    try:
        code = run_worker(app, argv)
    finally:
        shutdown(app)
        if server is not None:
            server.stop()
    if code:
        raise typer.Exit(code)
