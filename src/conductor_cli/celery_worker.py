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
    from celery.signals import worker_init, worker_ready

    workers: list[Any] = []

    def keep(sender: Any, **_: Any) -> None:
        workers.append(sender)

    def settle(**_: Any) -> None:
        settle_garbage_collector()

    worker_init.connect(keep, weak=False)
    worker_ready.connect(settle, weak=False)
    try:
        app.worker_main(argv)
    finally:
        worker_init.disconnect(keep)
        worker_ready.disconnect(settle)
    if not workers:
        return 1  # it never started: Celery printed why
    return int(workers[-1].exitcode or 0)
