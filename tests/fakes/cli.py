"""The ``conductor`` command run as a user runs it: a subprocess with its own environment; or,
where importing its dependencies again would cost most of the test, its command line in this
process."""

from __future__ import annotations

import os
import subprocess
import sys

CONDUCTOR = [sys.executable, "-c", "from conductor_cli import main; main()"]


def run_conductor(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CONDUCTOR, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def run_conductor_here(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``conductor`` command line run in this process (typer's runner), its outcome in the
    shape of a finished subprocess: an exception's traceback is in ``stderr``."""
    import traceback

    from typer.testing import CliRunner

    from conductor_cli import app

    result = CliRunner().invoke(app, list(args))
    stderr = result.stderr
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(
        ["conductor", *args], result.exit_code, result.stdout, stderr
    )
