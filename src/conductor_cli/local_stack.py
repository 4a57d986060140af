"""The distributed stack on one machine: planner, aggregators and gateways as processes.

``conductor stack`` runs this against the local Redis (or RabbitMQ) and Postgres; the fault
tests use it to kill and restart single processes. Each process is the same console command a
container would run, its output goes to a log file, and it counts as started once it prints its
ready line. Stopping sends SIGTERM in reverse start order (gateways and aggregators finish the
messages they hold; the planner drains) and SIGKILL to any process still there after a grace.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

from conductor.errors import ProcessStartError

logger = logging.getLogger(__name__)

ENTRY = "from conductor_cli import main; main()"
# Restarts of one process within a minute before the stack gives up on it.
MAX_RESTARTS = 5
# Starts of a process whose metrics port another process took between its choice and the bind.
PORT_TRIES = 3
# Where `conductor stack` and `conductor ask --distributed` look when nothing else is set.
LOCAL_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/conductor"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
READY_LINES = {
    "planner": b"conductor planner: serving",
    "aggregator": b"conductor aggregator: ready",
    "gateway": b"conductor gateway: ready",
    "serve": b"conductor serve: serving",
    "api": b"conductor api: serving",
}


def engine_threads(engines: int, cpus: int | None = None) -> int:
    """llama.cpp threads for each of ``engines`` engine processes on this machine: their share
    of the cores. An engine's threads spin while they wait for each other, so engines whose
    threads outnumber the cores slow each other down many times over (measured on 2 cores:
    two engines with 2 threads each took 50 s for what one did in 13 s; with 1 each, 21 s)."""
    return max(1, (cpus or os.cpu_count() or 1) // max(1, engines))


def local_stack_env() -> dict[str, str]:
    """Broker, Redis and database of the local stack: the environment's, else the defaults."""
    return {
        "CONDUCTOR_BROKER_URL": os.environ.get("CONDUCTOR_BROKER_URL", LOCAL_REDIS),
        "CONDUCTOR_REDIS_URL": os.environ.get("CONDUCTOR_REDIS_URL", LOCAL_REDIS),
        "CONDUCTOR_DATABASE_URL": os.environ.get("CONDUCTOR_DATABASE_URL", LOCAL_POSTGRES),
    }


@dataclass
class ServiceProcess:
    """One role's process (``conductor planner|aggregator|gateway ARGS``) and its log file."""

    role: str
    args: list[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    restarted_at: list[float] = field(default_factory=list)  # monotonic times
    stopped: bool = False  # by stop(): not to be started again by a supervisor
    # Whether it serves /metrics on a port of its own: chosen at each start, not long before
    # (another process could take it meanwhile), as ``metrics_port``.
    serves_metrics: bool = False
    metrics_port: int | None = None
    _log: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return self.log_path.stem

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, ready_timeout_s: float = 120.0) -> Self:
        tries = 1
        while True:
            try:
                return self._start_once(ready_timeout_s)
            except ProcessStartError as exc:
                if not (self.serves_metrics and exc.port_taken and tries < PORT_TRIES):
                    raise
            tries += 1
            logger.warning("%s: its metrics port was taken; starting it again", self.name)

    def _start_once(self, ready_timeout_s: float) -> Self:
        self.stopped = False
        self._close_log()  # the handle of a run that exited on its own
        self._log = self.log_path.open("ab")
        offset = self.log_path.stat().st_size
        env = {**os.environ, **self.env}
        if self.serves_metrics:
            self.metrics_port = free_port()
            env["CONDUCTOR_METRICS_PORT"] = str(self.metrics_port)
        self.process = subprocess.Popen(
            [sys.executable, "-c", ENTRY, self.role, *self.args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + ready_timeout_s
        while READY_LINES[self.role] not in self._log_bytes(offset):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._terminate()  # not stop(): a supervisor may try it again
                failed = ProcessStartError(
                    f"{self.name} did not start; the end of its log:\n{self.tail()}"
                )
                failed.port_taken = b"Address already in use" in self._log_bytes(offset)
                raise failed
            time.sleep(0.1)
        return self

    def _log_bytes(self, offset: int) -> bytes:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read()

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL: no shutdown and no acknowledgement, as when a node dies."""
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self._close_log()

    def stop(self, grace_s: float = 30.0) -> None:
        self.stopped = True
        self._terminate(grace_s)

    def _terminate(self, grace_s: float = 30.0) -> None:
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class LocalStack:
    """Starts the roles in dependency order: the planner, then aggregators, then gateways."""

    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    planner_port: int = 50051
    aggregators: int = 1
    gateways: int = 1
    gateway_concurrency: int = 100
    # Each process serves /metrics, /healthz and /readyz on a port of its own (metrics_ports).
    metrics: bool = False
    processes: list[ServiceProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "CONDUCTOR_PLANNER_ADDR": f"127.0.0.1:{self.planner_port}"}
        self.env = env
        self.processes = [
            self._process("planner", "planner", ["--port", str(self.planner_port)]),
            *(
                self._process("aggregator", f"aggregator-{i}", ["--loglevel", "WARNING"])
                for i in range(self.aggregators)
            ),
            *(self._gateway(i) for i in range(self.gateways)),
        ]

    @property
    def metrics_ports(self) -> dict[str, int]:
        """The metrics port of each started process, by name."""
        return {p.name: p.metrics_port for p in self.processes if p.metrics_port is not None}

    def _process(self, role: str, name: str, args: list[str]) -> ServiceProcess:
        log = self.log_dir / f"{name}.log"
        return ServiceProcess(role, args, log, dict(self.env), serves_metrics=self.metrics)

    def _gateway(self, index: int) -> ServiceProcess:
        args = ["--concurrency", str(self.gateway_concurrency), "--loglevel", "WARNING"]
        return self._process("gateway", f"gateway-{index}", args)

    def get(self, name: str) -> ServiceProcess:
        for process in self.processes:
            if process.name == name:
                return process
        raise KeyError(name)

    def start(self) -> None:
        try:
            for process in self.processes:
                process.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def restart_exited(self) -> list[str]:
        """Start again each process that exited on its own, as a supervisor would (a role exits
        non-zero on an unrecoverable error, e.g. Redis restarting under the Celery consumer).
        Returns the names started again; a process that exited ``MAX_RESTARTS`` times within a
        minute raises ProcessStartError: it cannot run here, and retrying hides why."""
        restarted = []
        now = time.monotonic()
        for process in self.processes:
            if process.process is None or process.running or process.stopped:
                continue
            process.restarted_at = [t for t in process.restarted_at if now - t < 60]
            if len(process.restarted_at) >= MAX_RESTARTS:
                raise ProcessStartError(
                    f"{process.name} exited {MAX_RESTARTS} times within a minute; the end of "
                    f"its log:\n{process.tail()}"
                )
            process.restarted_at.append(now)
            logger.warning(
                "%s exited (status %s); starting it again", process.name, process.process.poll()
            )
            try:
                process.start()
            except ProcessStartError as exc:
                logger.warning("%s", exc)  # tried again on the next call
            else:
                restarted.append(process.name)
        return restarted

    def add_gateway(self) -> ServiceProcess:
        """Start one more gateway (scaling out, or replacing a dead one)."""
        process = self._gateway(sum(p.role == "gateway" for p in self.processes))
        self.processes.append(process)
        return process.start()


def free_port() -> int:
    """A loopback port nothing listens on now (the OS picked it; the process takes it next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
