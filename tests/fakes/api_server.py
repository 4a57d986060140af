"""The API served on loopback from a thread of the test process (HTTP and gRPC).

The server is the real one (conductor_api.server.serve_api: uvicorn, the FastAPI app, the gRPC
Workflows service); the service behind it is built by the test, usually an embedded runtime
around scripted models so answers and token counts are known.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conductor.chat import ChatMessage, Completion, Usage
from conductor.executor import WorkflowExecutor
from conductor.pool import Price, Provider, Quotas
from conductor.ports import PlanFormat, PromptForm
from conductor.variants import BUILTIN_VARIANTS
from conductor_adapters.loop_thread import LoopThread
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.traces import TraceStore
from conductor_api.embedded import EmbeddedRuntime
from conductor_api.server import Listening, serve_api
from conductor_api.service import WorkflowService
from conductor_planner import ConductorPlanner

from fakes.scripted import ScriptedWorker, lists, named_pool, scripted_gateway

_POOL_LINE = re.compile(r"^Model (\d+): worker (\w+)$", re.MULTILINE)


class LiveApi:
    """Starts ``serve_api`` on free ports; ``url`` and ``grpc_address`` once it listens."""

    def __init__(
        self,
        make_service: Callable[[], WorkflowService],
        *,
        open_access: bool = False,
        cors_origins: Sequence[str] = (),
        allowed_hosts: Sequence[str] = (),
        metrics_port: int | None = None,
    ):
        self.loop = LoopThread("test-api-loop")
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._listening: Listening | None = None
        self.service = self.loop.run(_build(make_service))

        def ready(at: Listening) -> None:
            self._listening = at
            self._ready.set()

        self._serving = asyncio.run_coroutine_threadsafe(
            serve_api(
                self.service,
                host="127.0.0.1",
                port=0,
                grpc_port=0,
                open_access=open_access,
                cors_origins=cors_origins,
                allowed_hosts=allowed_hosts,
                metrics_port=metrics_port,
                on_ready=ready,
                stop=self._stop,
                grace_s=1,
            ),
            self.loop.loop,
        )
        if not self._ready.wait(30):
            self._serving.result(1)  # raises what stopped it
            raise AssertionError("the API did not start within 30 s")

    @property
    def url(self) -> str:
        assert self._listening is not None
        return self._listening.http_url

    @property
    def metrics_url(self) -> str:
        """Where /metrics is served once keys exist (given ``metrics_port``)."""
        assert self._listening is not None
        assert self._listening.metrics_url is not None
        return self._listening.metrics_url

    @property
    def grpc_address(self) -> str:
        assert self._listening is not None
        assert self._listening.grpc_address is not None
        return self._listening.grpc_address

    def close(self) -> None:
        self.loop.loop.call_soon_threadsafe(self._stop.set)
        self._serving.result(30)
        self.loop.stop()


async def _build(make_service: Callable[[], WorkflowService]) -> WorkflowService:
    return make_service()  # on the server's loop: the service's tasks live there


class TwoStepBackend:
    """A Conductor that solves with the first worker it is shown and has the second (if any)
    check with everything; it reads the pool from the prompt, so it follows pool options."""

    plan_format = PlanFormat.LISTS
    name = "two-step"
    prompt_form = PromptForm.FULL

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        shown = sorted({int(i) for i, _ in _POOL_LINE.findall(messages[-1].content)})
        if len(shown) >= 2:
            text = lists(shown[:2], ["Solve it.", "Check it."], [[], ["all"]])
        else:
            text = lists(shown[:1], ["Solve it."], [[]])
        return Completion(text=text, usage=Usage(prompt_tokens=100, completion_tokens=20))

    async def aclose(self) -> None:
        return None


def scripted_service(
    database_url: str,
    workers: Sequence[ScriptedWorker],
    price: Price | None = None,
    fallbacks: Mapping[str, Sequence[str]] | None = None,
    quotas: Mapping[str, Quotas] | None = None,
    providers: Mapping[str, Provider] | None = None,
) -> WorkflowService:
    """The API's service over the embedded runtime, around the two-step Conductor and
    scripted workers."""
    upgrade(database_url)
    engine = make_engine(database_url)
    pool = named_pool([w.name for w in workers], price, fallbacks, quotas, providers)
    gateway = scripted_gateway(pool, {w.name: w for w in workers})
    store = TraceStore(engine, pool)
    executor = WorkflowExecutor(
        planner=ConductorPlanner(TwoStepBackend()),
        pool=pool,
        gateway=gateway,
        observers=[store],
    )
    runtime = EmbeddedRuntime(executor, gateway, store, pool)
    return WorkflowService(runtime, BUILTIN_VARIANTS, "conductor-ultra")
