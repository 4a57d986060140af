"""Helpers for the planner service tests: slow and gated backends, an in-process server, and a
real ``conductor planner`` process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from conductor.chat import ChatMessage, Completion
from conductor.ports import PlannerBackend
from conductor_adapters.settings import Settings
from conductor_planner.server import PlannerServer, start_planner_server

from fakes.scripted import ScriptedBackend

ENTRY = "from conductor_cli import main; main()"


@dataclass
class SlowBackend(ScriptedBackend):
    """A ScriptedBackend that takes ``delay_s`` per call, without blocking the event loop."""

    delay_s: float = 0.3

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        await asyncio.sleep(self.delay_s)
        return await super().generate(
            messages, json_schema=json_schema, max_tokens=max_tokens, temperature=temperature
        )


class GatedFactory:
    """A backend factory that blocks (in the server's loading thread) until ``release()``."""

    def __init__(self, backend: PlannerBackend) -> None:
        self.backend = backend
        self.started = threading.Event()
        self._gate = threading.Event()

    def release(self) -> None:
        self._gate.set()

    def __call__(self, settings: Settings) -> PlannerBackend:
        self.started.set()
        if not self._gate.wait(timeout=60):  # a failed test must not hang the run forever
            raise TimeoutError("GatedFactory was never released")
        return self.backend


def factory_of(backend: PlannerBackend) -> Callable[[Settings], PlannerBackend]:
    return lambda _settings: backend


@contextlib.asynccontextmanager
async def running_planner(
    factory: Callable[[Settings], PlannerBackend] | None,
    *,
    settings: Settings | None = None,
    grace_s: float = 1.0,
) -> AsyncIterator[tuple[PlannerServer, grpc.aio.Channel]]:
    """An in-process planner server on a free port, and a channel to it."""
    server = await start_planner_server(
        settings or Settings(), "127.0.0.1", 0, backend_factory=factory, grace_s=grace_s
    )
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield server, channel
    finally:
        if isinstance(factory, GatedFactory):
            factory.release()
        await server.stop()


async def health_status(channel: grpc.aio.Channel, service: str) -> Any:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return reply.status


class PlannerProcess:
    """A real ``conductor planner --port 0`` process; its stderr lines are kept in ``lines``."""

    def __init__(self, env: Mapping[str, str], *args: str) -> None:
        self.env = {**os.environ, **env}
        self.args = args
        self.lines: list[str] = []
        self.address = ""
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._serving = asyncio.Event()

    async def start(self, ready_timeout_s: float = 60.0) -> PlannerProcess:
        command = [sys.executable, "-c", ENTRY, "planner", "--port", "0", *self.args]
        self.process = await asyncio.create_subprocess_exec(
            *command, env=self.env, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        self._reader = asyncio.create_task(self._read())
        try:
            await asyncio.wait_for(self._serving.wait(), ready_timeout_s)
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"the planner did not start; its log:\n{self.log()}") from None
        return self

    async def _read(self) -> None:
        assert self.process is not None
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            if found := re.search(r"listening on (\S+);", line):
                self.address = found.group(1)
            if "conductor planner: serving" in line:
                self._serving.set()

    def log(self) -> str:
        return "\n".join(self.lines[-50:])

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    async def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), timeout_s)
        if self._reader is not None:
            await self._reader
        return code

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 30 s."""
        if self.process is None:
            return
        if self.process.returncode is None:
            self.terminate()
            try:
                await self.wait(30)
            except TimeoutError:
                self.process.kill()
        await self.process.wait()
        if self._reader is not None:
            await self._reader
