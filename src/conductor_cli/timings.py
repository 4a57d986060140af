"""Wall time of a command's phases, for ``conductor ask --json`` (where does a run's time go)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Timings:
    """Named phases in milliseconds, in the order they ended; phases may overlap."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, started)

    def add(self, name: str, started: float) -> None:
        """Record a phase that began at ``started`` (a ``time.perf_counter()`` value)."""
        self.ms[name] = round((time.perf_counter() - started) * 1000, 1)


def process_age_ms() -> float | None:
    """How long ago this process started (interpreter start-up and imports included); None
    where the system does not say (this reads Linux's /proc)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
    return round((uptime_s - started_s) * 1000, 1)
