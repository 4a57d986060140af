"""``conductor aggregator``: runs workflows from the ``aggregator`` queue (distributed mode)."""

from __future__ import annotations

import os
import socket
import sys

import typer


def aggregator(
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        "-c",
        min=1,
        help="Messages handled at once (CONDUCTOR_AGGREGATOR_CONCURRENCY).",
    ),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l"),
) -> None:
    """Run an aggregator: plans through the planner service, dispatches steps to the gateways,
    records every workflow in Postgres and publishes its events.

    Needs CONDUCTOR_BROKER_URL, CONDUCTOR_DATABASE_URL (PostgreSQL, migrated with `conductor db
    upgrade`), CONDUCTOR_PLANNER_ADDR and the pool file the gateways use. Run as many replicas
    as you like: each workflow is changed by one of them at a time (a row lock).
    """
    from celery.signals import worker_ready, worker_shutdown

    from conductor.messaging import AGGREGATOR_QUEUE, queue_for
    from conductor_adapters.metrics_server import start_metrics_server
    from conductor_adapters.periodic import Periodic
    from conductor_adapters.queue import queue_depths
    from conductor_adapters.settings import get_settings
    from conductor_adapters.webhooks import allowed_networks
    from conductor_aggregator.celery_app import shutdown, sweeper
    from conductor_aggregator.metrics import AggregatorMetrics, backlog_poller
    from conductor_aggregator.settings import AggregatorSettings
    from conductor_cli.celery_worker import run_worker
    from conductor_cli.wiring import aggregator_celery, redis_answers

    settings = AggregatorSettings.load()
    allowed_networks()  # a bad CONDUCTOR_WEBHOOK_ALLOWED_NETWORKS fails here, not at a delivery
    metrics = AggregatorMetrics()
    app = aggregator_celery(get_settings(), settings, metrics)
    aggregator = app.conf.aggregator_get()  # connect now: a bad database or pool fails here
    sweeping = sweeper(app.conf.aggregator_get, settings.sweep_interval_s)
    port = get_settings().metrics_port
    server = start_metrics_server(metrics.registry, port, ready=redis_answers(settings.redis_url))
    poller: Periodic | None = None
    if server is not None:
        gateway_queues = sorted({queue_for(w) for w in aggregator.pool.workers})
        poller = backlog_poller(lambda: queue_depths(app, gateway_queues), metrics.backlog)
    argv = [
        "worker",
        "--pool=threads",
        f"--concurrency={concurrency or settings.aggregator_concurrency}",
        f"--queues={AGGREGATOR_QUEUE}",
        f"--loglevel={loglevel}",
        f"--hostname=aggregator-{os.getpid()}@{socket.gethostname()}",
        "--without-gossip",
        "--without-mingle",
    ]

    def announce(**_: object) -> None:
        sweeping.start()
        if poller is not None:
            poller.start()
        # Printed at any log level: scripts and tests wait for this line.
        line = f"conductor aggregator: ready, consuming {AGGREGATOR_QUEUE}"
        print(line, file=sys.stderr, flush=True)

    worker_ready.connect(announce, weak=False)
    worker_shutdown.connect(lambda **_: sweeping.stop(), weak=False)
    try:
        code = run_worker(app, argv)
    finally:
        sweeping.stop()
        if poller is not None:
            poller.stop()
        if server is not None:
            server.stop()
        shutdown(app)
    if code:
        raise typer.Exit(code)
