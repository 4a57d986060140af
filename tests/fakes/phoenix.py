"""Arize Phoenix, a real tracing backend, started for the tracing tests: it takes OTLP over HTTP
(``/v1/traces``) and serves what it stored through its REST API and its web UI."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from conductor_cli.local_stack import free_port

from fakes.servers import phoenix_binary

READY_WITHIN_S = 120.0


@dataclass
class Phoenix:
    url: str  # the UI and the REST API; OTLP over HTTP at url + /v1/traces
    log: Path

    def spans(self, project: str, trace_id: str) -> list[dict[str, Any]]:
        """Every span Phoenix stored of trace ``trace_id`` in ``project``."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"trace_id": trace_id, "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            reply = httpx.get(f"{self.url}/v1/projects/{project}/spans", params=params, timeout=10)
            if reply.status_code == 404:
                return []  # the project is made by its first span
            reply.raise_for_status()
            body = reply.json()
            found += body["data"]
            cursor = body.get("next_cursor")
            if not cursor:
                return found

    def wait_for_spans(
        self, project: str, trace_id: str, names: set[str], within_s: float = 60.0
    ) -> list[dict[str, Any]]:
        """The trace's spans once those named ``names`` have all arrived (a process exports
        its batch within OTEL_BSP_SCHEDULE_DELAY)."""
        deadline = time.monotonic() + within_s
        spans: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            spans = self.spans(project, trace_id)
            if names <= {s["name"] for s in spans}:
                return spans
            time.sleep(0.5)
        got = sorted({s["name"] for s in spans})
        raise AssertionError(f"spans {sorted(names - set(got))} never arrived; got {got}")

    def project_id(self, project: str) -> str:
        reply = httpx.get(f"{self.url}/v1/projects/{project}", timeout=10)
        reply.raise_for_status()
        return str(reply.json()["data"]["id"])

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@contextmanager
def running_phoenix(directory: Path) -> Iterator[Phoenix]:
    binary = phoenix_binary()
    if binary is None:
        raise RuntimeError("Arize Phoenix is not installed (see fakes.servers.phoenix_binary)")
    port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(directory / "data"),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        # Offline: no fonts, scripts or telemetry from the internet, no assistant.
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
        # Its migrations' SQL, thousands of lines, kept out of the log.
        "PHOENIX_LOG_MIGRATIONS": "false",
        "PHOENIX_DB_LOGGING_LEVEL": "warning",
    }
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    log = directory / "phoenix.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [binary, "serve"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=directory
        )
    phoenix = Phoenix(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"Phoenix exited ({process.returncode}):\n{phoenix.tail()}")
            try:
                if httpx.get(f"{phoenix.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Phoenix not ready in {READY_WITHIN_S:g} s:\n{phoenix.tail()}")
            time.sleep(0.5)
        yield phoenix
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
