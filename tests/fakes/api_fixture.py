"""The API under test, as the API tests share it: the real server on loopback, in front of the
embedded runtime or the distributed one (gRPC planner, aggregator and gateway on the Redis
broker, Postgres), with scripted models: a Conductor that solves with the first worker it is
shown and has the second check, and workers with known answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from conductor.errors import WorkerUnavailable
from conductor.pool import Provider, Quotas
from conductor.variants import BUILTIN_VARIANTS
from conductor_adapters.store.db import make_engine
from conductor_adapters.store.keys import create_key
from conductor_api.distributed import DistributedRuntime
from conductor_api.service import WorkflowService
from conductor_gateway.client import QueuedStepRunner

from fakes.api_server import LiveApi, TwoStepBackend, named_pool, scripted_service
from fakes.distributed import distributed_stack
from fakes.scripted import ScriptedWorker

NAMES = ["alpha", "beta", "gamma", "delta", "slow", "jsoner", "narrow", "native", "teller"]
SLOW_S = 60.0  # slow answers after a minute: long enough to be cancelled first
# delta is always down, and its pool entry falls back to alpha.
FALLBACKS = {"delta": ["alpha"]}
# narrow takes 2 calls at once, each NARROW_S long: a worker tenants queue for.
NARROW_S = 1.5
QUOTAS = {"narrow": Quotas(max_concurrency=2)}
# gamma runs on llama.cpp, whose wire format takes no tools; the others speak OpenAI's.
PROVIDERS = {"gamma": Provider.LLAMACPP}
DELTA_URL = "http://10.20.30.40:8000/v1/chat/completions"
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]
# alpha solves with the question alone; beta checks with alpha's turn (3 messages in all).
ANSWER = "beta answers 3 message(s)"


def _answer(name: str) -> Any:
    return lambda messages: f"{name} answers {len(messages)} message(s)"


def scripted_workers() -> list[ScriptedWorker]:
    return [
        ScriptedWorker("alpha", answer=_answer("alpha")),
        ScriptedWorker("beta", answer=_answer("beta")),
        ScriptedWorker("gamma", delay_s=0.6, answer=_answer("gamma")),  # slow: for events
        # Its failure names an internal address: clients must not see it, the trace keeps it.
        ScriptedWorker("delta", fail_with=WorkerUnavailable(f"delta is down at {DELTA_URL}")),
        ScriptedWorker("slow", delay_s=SLOW_S),
        ScriptedWorker("jsoner", answer=json_when_asked),
        ScriptedWorker("narrow", delay_s=NARROW_S, answer=_answer("narrow")),
        # Writes JSON only when its provider is asked for it natively, prose when told in words.
        ScriptedWorker("native", answer=lambda _: "forty-two", native_json=JSON_ANSWER),
        # Streamed, it tells its answer a word every TELLER_WORD_S.
        ScriptedWorker("teller", answer=lambda _: TOLD, word_delay_s=TELLER_WORD_S),
    ]


JSON_ANSWER = {"answer": 42, "unit": "none"}
TOLD = "six times seven is forty-two"
TELLER_WORD_S = 0.05


def json_when_asked(messages: list[Any]) -> str:
    """Answers JSON, wrapped as models wrap it, when told to; prose otherwise."""
    if "JSON" in messages[-1].content:
        return f"Here it is:\n```json\n{json.dumps(JSON_ANSWER)}\n```"
    return "forty-two"


@dataclass
class Api:
    server: LiveApi
    workers: dict[str, ScriptedWorker]
    key: str  # tenant acme, any worker
    other_key: str  # tenant globex
    alpha_key: str  # tenant acme, may use alpha only
    delta_key: str  # tenant acme, may use delta only

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or self.key, max_retries=0)

    def http(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key or self.key}"}, timeout=30
        )


API_RUNTIMES = [
    "embedded",
    # Slow tier: a Celery worker, the gRPC planner and Postgres behind every test. The fast tier
    # runs each API test on the embedded runtime; the whole suite runs both.
    pytest.param("distributed", marks=[pytest.mark.postgres, pytest.mark.broker, pytest.mark.slow]),
]


def running_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    """The ``api`` fixture's body: ``request.param`` names the runtime (API_RUNTIMES)."""
    workers = scripted_workers()
    with ExitStack() as stack:
        if request.param == "embedded":
            database = tmp_path_factory.mktemp("api") / "conductor.db"
            server = LiveApi(
                lambda: scripted_service(
                    f"sqlite:///{database}",
                    workers,
                    fallbacks=FALLBACKS,
                    quotas=QUOTAS,
                    providers=PROVIDERS,
                ),
                metrics_port=0,
            )
        else:
            database_url: str = request.getfixturevalue("module_postgres_url")
            redis_url: str = request.getfixturevalue("redis_url")
            prefix: str = request.getfixturevalue("module_redis_prefix")
            running = stack.enter_context(distributed_stack(database_url, redis_url, prefix))
            pool = named_pool(NAMES, fallbacks=FALLBACKS, quotas=QUOTAS, providers=PROVIDERS)
            running.configure(TwoStepBackend(), pool, {w.name: w for w in workers})

            def distributed_service() -> WorkflowService:
                redis = aioredis.Redis.from_url(redis_url)
                runtime = DistributedRuntime(
                    engine=make_engine(database_url),
                    app=running.app,
                    redis=redis,
                    redis_prefix=prefix,
                    runner=QueuedStepRunner(running.app, pool, redis, prefix=prefix),
                    pool=pool,
                    planner_addr=running.planner_server.address,
                )
                return WorkflowService(runtime, BUILTIN_VARIANTS, "conductor-ultra")

            server = LiveApi(distributed_service, metrics_port=0)
        stack.callback(server.close)
        engine = server.service.engine
        yield Api(
            server=server,
            workers={w.name: w for w in workers},
            key=create_key(engine, "acme").secret,
            other_key=create_key(engine, "globex").secret,
            alpha_key=create_key(engine, "acme", allowed_pool=["alpha"]).secret,
            delta_key=create_key(engine, "acme", allowed_pool=["delta"]).secret,
        )
