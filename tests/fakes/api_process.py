"""Starts ``conductor serve`` or ``conductor api`` as a process on free ports, for tests."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path

from conductor_cli.local_stack import LocalStack, ServiceProcess

_READY = re.compile(r"conductor (?:serve|api): serving on (http://\S+?)(?:, gRPC on (\S+))?$")


def start_api_role(role: str, log_path: Path, env: Mapping[str, str]) -> ServiceProcess:
    """``conductor ROLE`` (serve or api) on free ports, started once it printed its ready line."""
    args = ["--port", "0", "--grpc-port", "0"]
    return ServiceProcess(role, args, log_path, dict(env)).start()


def announced_addresses(process: ServiceProcess) -> tuple[str, str]:
    """The HTTP URL and gRPC address the process announced in its ready line."""
    for line in process.log_path.read_text(errors="replace").splitlines():
        found = _READY.search(line)
        if found and found.group(2):
            return found.group(1), found.group(2)
    raise AssertionError(f"no ready line with both ports in:\n{process.tail()}")


def start_api_beside(stack: LocalStack, log_path: Path) -> ServiceProcess:
    """``conductor api`` started while ``stack`` starts (it needs nothing of the stack to
    start), with the stack's settings; on any failure, whatever started is stopped."""
    started: list[ServiceProcess] = []
    failures: list[BaseException] = []

    def start_api() -> None:
        try:
            started.append(start_api_role("api", log_path, dict(stack.env)))
        except BaseException as exc:
            failures.append(exc)

    starter = threading.Thread(target=start_api)
    starter.start()
    try:
        stack.start()
    except BaseException:
        starter.join()
        for process in started:
            process.stop()
        raise
    starter.join()
    if failures:
        stack.stop()
        raise failures[0]
    return started[0]
