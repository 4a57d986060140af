"""Running a role's Celery worker in this process, with its exit status."""

from __future__ import annotations

from typing import Any

from celery import Celery

from conductor_cli.server_process import settle_garbage_collector


def run_worker(app: Celery, argv: list[str]) -> int:
    """Run ``celery worker ARGV`` and return its exit code.

    Celery's ``worker_main`` drops the code: a worker stopped by an unrecoverable error (for
    one, kombu failing while Redis restarts) would exit 0, and a supervisor that restarts only
    failed processes would leave the role down. The code is read from the worker itself.
    """
    from celery.signals import after_setup_logger, worker_init, worker_ready

    from conductor_adapters.telemetry import add_trace_ids_to_log_format

    workers: list[Any] = []

    def keep(sender: Any, **_: Any) -> None:
        workers.append(sender)

    def settle(**_: Any) -> None:
        settle_garbage_collector()

    def log_trace_ids(logger: Any, **_: Any) -> None:
        # Celery replaced the root logger's handlers: its records carry the ids again.
        add_trace_ids_to_log_format(list(logger.handlers))

    worker_init.connect(keep, weak=False)
    worker_ready.connect(settle, weak=False)
    after_setup_logger.connect(log_trace_ids, weak=False)
    try:
        app.worker_main(argv)
    finally:
        worker_init.disconnect(keep)
        worker_ready.disconnect(settle)
        after_setup_logger.disconnect(log_trace_ids)
    if not workers:
        return 1  # it never started: Celery printed why
    return int(workers[-1].exitcode or 0)
