"""The scripted API service (``fakes.api_server.scripted_service``, workers alpha and beta), its
requests per minute limited through Redis, served as an OS process of its own on loopback.

    python -m fakes.scripted_api_process --database-url URL --redis-url URL --prefix PREFIX

prints the URL it serves on (one line) once it listens, and serves until SIGTERM or SIGINT;
then it stops as ``conductor api`` does (``serve_api``) and exits with 0. Tests start it with
``start_scripted_api`` (``tests/`` on PYTHONPATH, as pytest has it on sys.path) and stop it
with ``ScriptedApiProcess.stop``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conductor_api.key_limits import KeyLimiter
from conductor_api.server import Listening, serve_api

from fakes.api_server import scripted_service
from fakes.scripted import ScriptedWorker

TESTS_DIR = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


@dataclass
class ScriptedApiProcess:
    """A started process, the URL it announced, and its stdout and stderr files."""

    process: subprocess.Popen[bytes]
    url: str
    stdout_path: Path
    stderr_path: Path

    def stderr(self, chars: int = 4000) -> str:
        return self.stderr_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL if it is still there after ``timeout_s``; its exit status."""
        return _stop(self.process, timeout_s)


def start_scripted_api(
    name: str,
    log_dir: Path,
    *,
    database_url: str,
    redis_url: str,
    prefix: str,
    timeout_s: float = START_TIMEOUT_S,
) -> ScriptedApiProcess:
    """Starts the module as a process; returns once it printed its URL. A process that exits
    first, or prints nothing within ``timeout_s``, is stopped and raises AssertionError with
    its stderr."""
    stdout_path = log_dir / f"{name}.out"
    stderr_path = log_dir / f"{name}.err"
    python_path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    args = ["--database-url", database_url, "--redis-url", redis_url, "--prefix", prefix]
    with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "fakes.scripted_api_process", *args],
            env={**os.environ, "PYTHONPATH": python_path},
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        printed = stdout_path.read_text(errors="replace")
        if printed.endswith("\n"):
            return ScriptedApiProcess(process, printed.strip(), stdout_path, stderr_path)
        status = process.poll()
        if status is not None or time.monotonic() > deadline:
            _stop(process, STOP_TIMEOUT_S)
            late = f"no URL printed within {timeout_s:g} s"
            why = late if status is None else f"exited with {status}"
            raise AssertionError(
                f"{name} did not start ({why}); its stdout:\n{printed}\nits stderr:\n"
                + stderr_path.read_text(errors="replace")[-4000:]
            )
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout_s)


async def _serve(database_url: str, redis_url: str, prefix: str) -> None:
    # Built on the serving loop: the service's tasks live there.
    service = scripted_service(database_url, [ScriptedWorker("alpha"), ScriptedWorker("beta")])
    service.limiter = KeyLimiter.on_redis(service.engine, redis_url, prefix)

    def ready(at: Listening) -> None:
        print(at.http_url, flush=True)

    await serve_api(service, host="127.0.0.1", port=0, grpc_port=None, on_ready=ready, grace_s=1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fakes.scripted_api_process")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True, help="Redis key prefix of the rate limits")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.database_url, args.redis_url, args.prefix))


if __name__ == "__main__":
    main()
