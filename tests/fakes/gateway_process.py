"""Starts real ``conductor gateway`` processes for the queue tests and benchmarks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from conductor_cli.local_stack import ServiceProcess


def write_pool_file(path: Path, workers: Mapping[str, Mapping[str, object]]) -> Path:
    path.write_text(yaml.safe_dump({"workers": {k: dict(v) for k, v in workers.items()}}))
    return path


def start_gateway(
    env: Mapping[str, str],
    log_path: Path,
    *,
    queues: str,
    concurrency: int = 50,
    loglevel: str = "INFO",
) -> ServiceProcess:
    """A started ``conductor gateway`` process; its log goes to a file the test can show."""
    args = ["-Q", queues, "-c", str(concurrency), "-l", loglevel]
    return ServiceProcess("gateway", args, log_path, env).start(ready_timeout_s=60)
