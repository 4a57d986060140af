"""A role's Celery worker stopped by an unrecoverable error exits non-zero, so a supervisor that
restarts only failed processes starts it again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

# A worker whose start fails the way Celery's consumer does when kombu breaks under it: an
# exception out of a bootstep, which Celery logs as "Unrecoverable error" and stops on.
WORKER = textwrap.dedent(
    """
    import sys
    from celery import Celery, bootsteps
    from conductor_cli.celery_worker import run_worker

    class Unrecoverable(bootsteps.StartStopStep):
        requires = {"celery.worker.components:Pool"}

        def start(self, worker):
            raise RuntimeError("an unrecoverable error")

    app = Celery("failing", broker="memory://")
    app.steps["worker"].add(Unrecoverable)
    argv = ["worker", "--pool=threads", "--concurrency=1", "--without-heartbeat",
            "--without-mingle", "--without-gossip"]
    if sys.argv[1] == "worker_main":
        app.worker_main(argv)
        sys.exit(0)
    sys.exit(run_worker(app, argv))
    """
)


def _exit_status(tmp_path: Path, how: str) -> tuple[int, str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = subprocess.run(
        [sys.executable, str(script), how], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stderr


def test_an_unrecoverable_error_gives_a_non_zero_exit_status(tmp_path: Path) -> None:
    status, log = _exit_status(tmp_path, "run_worker")
    assert "an unrecoverable error" in log
    assert status == 1


def test_celerys_own_worker_main_would_have_exited_zero(tmp_path: Path) -> None:
    # Why run_worker exists: Celery's worker_main drops the worker's exit code.
    status, log = _exit_status(tmp_path, "worker_main")
    assert "an unrecoverable error" in log
    assert status == 0
