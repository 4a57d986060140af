"""The ``conductor`` command run as a user runs it: a subprocess with its own environment."""

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
