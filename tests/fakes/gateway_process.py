"""Starts and kills real ``conductor gateway`` processes for the queue tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Self

import yaml

ENTRY = "from conductor.cli import main; main()"


def write_pool_file(path: Path, workers: Mapping[str, Mapping[str, object]]) -> Path:
    path.write_text(yaml.safe_dump({"workers": {k: dict(v) for k, v in workers.items()}}))
    return path


class GatewayProcess:
    """One ``conductor gateway`` process; its log goes to a file the test can show on failure."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        *,
        queues: str,
        concurrency: int = 50,
        loglevel: str = "INFO",
    ) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.queues = queues
        self.concurrency = concurrency
        self.loglevel = loglevel
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, ready_timeout_s: float = 60.0) -> Self:
        self._log = self.log_path.open("ab")
        command = [sys.executable, "-c", ENTRY, "gateway", "-Q", self.queues]
        command += ["-c", str(self.concurrency), "-l", self.loglevel]
        self.process = subprocess.Popen(
            command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + ready_timeout_s
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway did not start; its log:\n{self.log()}")
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        return b"conductor gateway: ready" in self.log_path.read_bytes()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown, no acknowledgement, as when a node dies."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None
