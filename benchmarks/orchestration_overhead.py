"""What orchestrating costs on top of the provider, embedded and distributed, against fake
upstreams and against LiteLLM's proxy doing the same pass-through job.

A fake OpenAI-compatible provider that answers at once, another that answers in one second, and
a fake Conductor (its plans: N chained steps on Model 0, N named in the question) each run in a
process of their own. Requests come from one asyncio client (httpx) in this process. Targets,
each started only for its own runs:

- direct: straight to the instant provider (the floor), and the burst straight to the
  one-second provider (the bursts' floor);
- litellm (with ``--litellm-venv``, which needs ``litellm[proxy]`` and ``httptools``, the HTTP
  parser conductor's servers use): LiteLLM's proxy, one worker, in its own virtual
  environment, passing calls through to the same providers;
- serve: ``conductor serve`` (embedded runtime, SQLite);

Every server target is called with an API key (LiteLLM's master key, a key of conductor's
own): an open ``conductor serve`` would skip the key's checks and spend counting.
- distributed: ``conductor api`` with the planner, one aggregator and one gateway
  (``conductor_cli.local_stack``), Redis broker, PostgreSQL, all on this machine;
- tracing: ``conductor serve``'s one-step workflow with tracing off, then on (OTLP over HTTP
  to a receiver in this process, ``otlp_sink``), alternating twice; it prints the server CPU
  per workflow with tracing on as a ratio to off;
- ttft: time to first token and to the last of streamed requests, one at a time, on a fourth
  fake that writes its answer a word every 0.1 s (whole answers take as long): the call
  direct, then pass-through and one- and three-step workflows on ``serve`` and distributed,
  beside the fake Conductor's time for a plan; it prints whether the one-step workflow's first
  token came within the planner's time plus the direct call's first token plus 20 ms (serve)
  or 60 ms (distributed).

Paths: pass-through (Chat Completions with a worker as the model), one-step and three-step
workflows (the variant as the model). Each is measured sequentially (latency p50/p95/p99) and
with 50 requests in flight (throughput); the server's CPU (user + system of its processes and
their children, from /proc) is divided by the requests it served. Then 500 calls of the
one-second provider all at once (the wall time, against the one second a provider takes), and
distributed pass-through kept at 50 in flight for 60 s (its p99 against its p50).

    python benchmarks/orchestration_overhead.py [--sequential 200] [--requests 500]
        [--in-flight 50] [--burst 500] [--sustain 60] [--litellm-venv PATH]
        [--postgres URL] [--redis URL] [--only serve,distributed,tracing,ttft,...] [--repeat 1]
        [--ttft-requests 20] [--out out/orchestration]

Needs PostgreSQL and Redis for the distributed target (a database and a key prefix of its own,
removed afterwards). Prints a table per run and, with ``--repeat N``, the median of each
figure over the N runs (this machine's speed drifts by up to 20% between runs); writes
``results.json`` (the medians and every run) and, with matplotlib, ``overhead.png`` under
--out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
import yaml  # noqa: E402
from otlp_sink import OtlpSink  # noqa: E402
from sqlalchemy import text  # noqa: E402

from conductor_adapters.http_wire import new_client  # noqa: E402
from conductor_adapters.store.db import make_engine, upgrade  # noqa: E402
from conductor_adapters.store.keys import create_key  # noqa: E402
from conductor_cli.local_stack import (  # noqa: E402
    LocalStack,
    ServiceProcess,
    free_port,
)

from fakes.api_process import announced_addresses, start_api_role  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
QUESTION = "What is 6 * 7?"
MAX_FAILURE_REASONS = 5
MAX_TRACING_RATIO = 1.25  # tracing on may cost at most 25% more CPU per workflow
TARGETS = ("direct", "litellm", "serve", "distributed", "tracing", "ttft")
TRACED = "serve, tracing on"
UNTRACED = "serve, tracing off"
WORD_DELAY_S = 0.1  # the streaming provider's pace: its echo of a question takes about 1 s
# How much later than the planner's time plus the direct call's first token a streamed
# one-step workflow's first token may come (the aim; distributed adds Redis and two hops).
TTFT_MARGIN_MS = {"serve": 20.0, "distributed": 60.0}


@dataclass
class Phase:
    path: str
    mode: str  # sequential | in-flight | burst | sustained
    requests: int
    concurrency: int
    wall_s: float
    latencies_ms: list[float] = field(repr=False)
    server_cpu_ms_per_request: float
    failures: int
    # The first few failures' reasons (status and body, or the client error), printed so a
    # failed call is explained rather than only counted.
    failure_reasons: list[str] = field(default_factory=list, repr=False)

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    def percentile(self, q: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else float("nan")
        return statistics.quantiles(self.latencies_ms, n=100)[q - 1]

    def summary(self) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k != "latencies_ms"}
        row |= {
            "p50_ms": round(self.percentile(50), 2),
            "p95_ms": round(self.percentile(95), 2),
            "p99_ms": round(self.percentile(99), 2),
            "per_second": round(self.throughput, 1),
        }
        return row


@dataclass
class Target:
    """A server under test: where its Chat Completions are, the processes whose CPU it uses,
    and the headers a client sends it."""

    name: str
    completions_url: str
    pids: list[int]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Upstreams:
    instant: FakeUpstream
    slow: FakeUpstream
    planner: FakeUpstream
    # Streams its answer a word every WORD_DELAY_S (for time to first token).
    streamer: FakeUpstream

    def stop(self) -> None:
        for upstream in (self.instant, self.slow, self.planner, self.streamer):
            upstream.stop()


class FakeUpstream:
    """``python -m fakes.serve openai`` in its own process; its base URL once it listens."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fakes.serve", "openai", *args],
            cwd=ROOT / "tests",
            env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError(f"fake upstream {args} did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def process_tree_cpu_s(pids: list[int]) -> float:
    """User plus system CPU seconds used by ``pids`` and every descendant alive now, plus what
    their reaped children used (fields 14 to 17 of /proc/PID/stat)."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15])
    wanted = set(pids)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in wanted} - wanted
        wanted |= children
        grew = bool(children)
    return sum(times.get(pid, 0) for pid in wanted) / CLOCK_TICKS


def pool_file(directory: Path, upstreams: Upstreams) -> Path:
    pool = {
        "workers": {
            name: {
                "provider": "openai-compatible",
                "model": name,
                "base_url": upstream.base_url,
                "price": {"input": 1.0, "output": 2.0},
                "max_tokens": 16,
            }
            for name, upstream in (
                ("fast", upstreams.instant),
                ("slow", upstreams.slow),
                ("streamer", upstreams.streamer),
            )
        }
    }
    path = directory / "pool.yaml"
    path.write_text(yaml.safe_dump(pool, sort_keys=False))
    return path


def planner_env(directory: Path, upstreams: Upstreams) -> dict[str, str]:
    return {
        "CONDUCTOR_POOL_FILE": str(pool_file(directory, upstreams)),
        "CONDUCTOR_PLANNER_BACKEND": "openai",
        "CONDUCTOR_PLANNER_BASE_URL": upstreams.planner.base_url,
        "CONDUCTOR_PLANNER_MODEL": "fake-conductor",
    }


@contextlib.contextmanager
def serve_target(
    directory: Path, upstreams: Upstreams, name: str = "serve", env: dict[str, str] | None = None
) -> Iterator[Target]:
    """``conductor serve`` with an API key, as every target runs: an open server skips the
    key's lookup, limits and spend counting (measured: 40% of a pass-through's CPU).
    ``env``: more variables for the server (tracing's)."""
    directory = directory / name.replace(" ", "-").replace(",", "")
    directory.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{directory / 'conductor.db'}"
    upgrade(database_url)
    engine = make_engine(database_url)
    secret = create_key(engine, "bench").secret
    engine.dispose()
    env = {
        **planner_env(directory, upstreams),
        "CONDUCTOR_DATABASE_URL": database_url,
        **(env or {}),
    }
    serve = start_api_role("serve", directory / "serve.log", env)
    try:
        url, _ = announced_addresses(serve)
        assert serve.process is not None
        headers = {"Authorization": f"Bearer {secret}"}
        yield Target(name, f"{url}/v1/chat/completions", [serve.process.pid], headers)
    finally:
        serve.stop()


def run_tracing(options: argparse.Namespace, upstreams: Upstreams, tmp: Path) -> list[Phase]:
    """The one-step workflow on ``conductor serve`` untraced, then traced (every span exported
    over OTLP/HTTP to a local receiver), twice in turn so both see the machine alike."""
    body = workflow_body(1, "fast")
    phases: list[Phase] = []
    # Variables of the caller's environment must not trace the untraced server.
    untraced = {name: "" for name in os.environ if name.startswith("OTEL_")}
    with OtlpSink() as sink:
        traced = {
            **untraced,
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "conductor-bench",
        }
        for turn in range(2):
            for name, env in ((UNTRACED, untraced), (TRACED, traced)):
                with serve_target(tmp / f"tracing-{turn}", upstreams, name, env) as target:
                    phases += asyncio.run(
                        measure_target(target, options, [("one-step workflow", body)], [])
                    )
        time.sleep(6)  # the servers' last batches (sent as they stop) are in
    print(f"tracing: {sink.spans} spans received from {', '.join(sorted(sink.services))}")
    return phases


def report_tracing(rows: list[dict[str, Any]]) -> None:
    """Server CPU per one-step workflow with tracing on, as a ratio to off (medians)."""
    for mode in ("sequential", "in-flight"):
        cpu = {
            target: statistics.median(
                r["server_cpu_ms_per_request"]
                for r in rows
                if r["mode"] == mode and r["path"] == f"{target}: one-step workflow"
            )
            for target in (UNTRACED, TRACED)
            if any(r["path"] == f"{target}: one-step workflow" for r in rows)
        }
        if len(cpu) == 2:
            ratio = cpu[TRACED] / cpu[UNTRACED]
            print(
                f"tracing on/off, server CPU per one-step workflow ({mode}): "
                f"{cpu[TRACED]:.2f} / {cpu[UNTRACED]:.2f} ms = {ratio:.2f} "
                f"({'within' if ratio <= MAX_TRACING_RATIO else 'over'} {MAX_TRACING_RATIO:g})",
                flush=True,
            )


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A database of its own on the PostgreSQL server, migrated, dropped afterwards."""
    name = f"conductor_bench_{uuid.uuid4().hex[:12]}"
    admin = make_engine(server_url).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def distributed_target(
    directory: Path, upstreams: Upstreams, postgres_url: str, redis_url: str
) -> Iterator[Target]:
    """``conductor api`` and the stack (planner, one aggregator, one gateway) on the Redis
    broker and PostgreSQL, with an API key of their own."""
    prefix = f"conductor-bench-{uuid.uuid4().hex[:8]}:"
    with scratch_database(postgres_url) as database_url:
        engine = make_engine(database_url)
        secret = create_key(engine, "bench").secret
        engine.dispose()
        env = {
            **planner_env(directory, upstreams),
            "CONDUCTOR_DATABASE_URL": database_url,
            "CONDUCTOR_BROKER_URL": redis_url,
            "CONDUCTOR_REDIS_URL": redis_url,
            "CONDUCTOR_REDIS_PREFIX": prefix,
        }
        stack = LocalStack(directory / "logs", env, planner_port=free_port())
        processes: list[ServiceProcess] = []
        try:
            stack.start()
            processes += stack.processes
            api = start_api_role("api", directory / "api.log", stack.env)
            processes.append(api)
            url, _ = announced_addresses(api)
            pids = [p.process.pid for p in processes if p.process is not None]
            headers = {"Authorization": f"Bearer {secret}"}
            yield Target("distributed", f"{url}/v1/chat/completions", pids, headers)
        finally:
            for process in reversed(processes):
                process.stop()
            stack.stop()
            _forget_redis_keys(redis_url, prefix)


def _forget_redis_keys(redis_url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


@contextlib.contextmanager
def litellm_target(directory: Path, upstreams: Upstreams, venv: Path) -> Iterator[Target]:
    """LiteLLM's proxy (one worker) from its own virtual environment, routing the two workers
    to the same fake providers; no database, callbacks or network lookups."""
    config = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {
                    "model": f"openai/{name}",
                    "api_base": upstream.base_url,
                    "api_key": "fake-key",
                },
            }
            for name, upstream in (("fast", upstreams.instant), ("slow", upstreams.slow))
        ],
        "litellm_settings": {
            "callbacks": [],
            "success_callback": [],
            "failure_callback": [],
            "drop_params": True,
        },
        "general_settings": {
            "disable_spend_logs": True,
            "disable_error_logs": True,
            "background_health_checks": False,
        },
    }
    config_path = directory / "litellm.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    master_key = f"sk-bench-{uuid.uuid4().hex}"  # the proxy refuses to start without one
    env = {**os.environ, **LITELLM_ENV, "LITELLM_MASTER_KEY": master_key}
    env.pop("DATABASE_URL", None)
    log = (directory / "litellm.log").open("w")
    command = [str(venv / "bin" / "litellm"), "--config", str(config_path)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    proxy = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(f"{base}/health/liveliness", proxy, directory / "litellm.log")
        headers = {"Authorization": f"Bearer {master_key}"}
        yield Target("litellm", f"{base}/v1/chat/completions", [proxy.pid], headers)
    finally:
        proxy.terminate()
        try:
            proxy.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proxy.kill()
        log.close()


# Offline and lean: the bundled model cost map (else it is fetched from GitHub), quiet logs, no
# .env file read from the working directory.
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "true",
}


def _wait_ready(
    url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 120
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready within {timeout_s:g} s:\n{log.read_text()[-3000:]}")


def chat_body(model: str, question: str, pool: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": question}]}
    if pool is not None:
        body["conductor"] = {"pool": pool}
    return body


def workflow_body(steps: int, worker: str) -> dict[str, Any]:
    return chat_body("conductor-ultra", f"[{steps} steps] {QUESTION}", [worker])


async def measure(
    client: httpx.AsyncClient,
    target: Target,
    path: str,
    mode: str,
    body: dict[str, Any],
    *,
    concurrency: int,
    requests: int = 0,
    duration_s: float = 0.0,
) -> Phase:
    """``requests`` calls, or as many as ``duration_s`` allows, ``concurrency`` at a time."""
    latencies: list[float] = []
    failures = 0
    reasons: list[str] = []
    deadline = time.perf_counter() + duration_s
    remaining = requests

    async def sender() -> None:
        nonlocal failures, remaining
        while (remaining > 0) if not duration_s else (time.perf_counter() < deadline):
            remaining -= 1
            started = time.perf_counter()
            try:
                response = await client.post(
                    target.completions_url, json=body, headers=target.headers, timeout=600
                )
                ok = response.status_code == 200
                reason = "" if ok else f"HTTP {response.status_code}: {response.text[:300]}"
            except httpx.HTTPError as exc:
                ok, reason = False, f"{type(exc).__name__}: {exc}"
            latencies.append((time.perf_counter() - started) * 1000)
            failures += not ok
            if reason and len(reasons) < MAX_FAILURE_REASONS:
                reasons.append(reason)

    cpu_before = process_tree_cpu_s(target.pids) if target.pids else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    cpu = (process_tree_cpu_s(target.pids) - cpu_before) if target.pids else 0.0
    served = len(latencies)
    return Phase(
        path=f"{target.name}: {path}",
        mode=mode,
        requests=served,
        concurrency=concurrency,
        wall_s=round(wall, 3),
        latencies_ms=latencies,
        server_cpu_ms_per_request=round(cpu * 1000 / served, 2) if served else 0.0,
        failures=failures,
        failure_reasons=reasons,
    )


async def measure_target(
    target: Target,
    options: argparse.Namespace,
    paths: list[tuple[str, dict[str, Any]]],
    extra: list[tuple[str, str, dict[str, Any], int, float]],
) -> list[Phase]:
    """Each path sequentially and in flight, then the ``extra`` runs
    (path, mode, body, concurrency, seconds: 0 for ``concurrency`` calls once)."""
    phases: list[Phase] = []
    # The client is the server's own provider client (httpx on aiohttp): with httpx's stock
    # pool, the client spent 6 s of CPU on 500 calls in flight and was what limited the
    # bursts, not the server.
    async with new_client() as client:
        for path, body in paths:
            for _ in range(5):  # warm-up: connections, caches, the first plan
                await client.post(
                    target.completions_url, json=body, headers=target.headers, timeout=600
                )
            for mode, requests, concurrency in (
                ("sequential", options.sequential, 1),
                ("in-flight", options.requests, options.in_flight),
            ):
                phase = await measure(
                    client, target, path, mode, body, concurrency=concurrency, requests=requests
                )
                report(phase)
                phases.append(phase)
        for path, mode, body, concurrency, seconds in extra:
            phase = await measure(
                client,
                target,
                path,
                mode,
                body,
                concurrency=concurrency,
                requests=0 if seconds else concurrency,
                duration_s=seconds,
            )
            report(phase)
            phases.append(phase)
    return phases


async def time_to_tokens(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], n: int
) -> tuple[list[float], list[float]]:
    """``n`` streamed requests one at a time: the ms to the first answer text, and to the
    stream's end, of each."""
    first_ms: list[float] = []
    last_ms: list[float] = []
    for _ in range(n):
        started, first = time.perf_counter(), None
        async with client.stream(
            "POST", url, json={**body, "stream": True}, headers=headers, timeout=600
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {") and _has_text(line[6:]):
                    first = time.perf_counter()
        ended = time.perf_counter()
        first_ms.append(((first or ended) - started) * 1000)
        last_ms.append((ended - started) * 1000)
    return first_ms, last_ms


def _has_text(data: str) -> bool:
    choices = json.loads(data).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


async def planner_ms(client: httpx.AsyncClient, upstreams: Upstreams, n: int) -> list[float]:
    """The fake Conductor's time for a one-step plan, as the planner calls it."""
    body = chat_body("fake-conductor", f"[1 steps] {QUESTION}")
    times = []
    for _ in range(n):
        started = time.perf_counter()
        response = await client.post(
            f"{upstreams.planner.base_url}/chat/completions", json=body, timeout=60
        )
        response.raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return times


def run_ttft(options: argparse.Namespace, upstreams: Upstreams, tmp: Path) -> list[dict[str, Any]]:
    """Time to first token and to the last, streamed, one request at a time: the streaming
    provider called directly, then pass-through and one- and three-step workflows on it, on
    ``conductor serve`` and distributed; and the planner's own time, all in this run."""
    n = options.ttft_requests
    rows: list[dict[str, Any]] = []

    async def measure_paths(target: Target, paths: list[tuple[str, dict[str, Any]]]) -> None:
        async with new_client() as client:
            for path, body in paths:
                await time_to_tokens(client, target.completions_url, body, target.headers, 2)
                first, last = await time_to_tokens(
                    client, target.completions_url, body, target.headers, n
                )
                rows.append(
                    {
                        "target": target.name,
                        "path": path,
                        "first_token_p50_ms": round(statistics.median(first), 1),
                        "last_token_p50_ms": round(statistics.median(last), 1),
                    }
                )

    async def direct_and_planner() -> None:
        direct = Target("direct", f"{upstreams.streamer.base_url}/chat/completions", [])
        # Asking for the usage as conductor asks its providers (it needs it for the cost): the
        # usage chunk comes one word's time after the last, and a direct call without it ended
        # that much sooner than a pass-through could.
        call = {**chat_body("streamer", QUESTION), "stream_options": {"include_usage": True}}
        await measure_paths(direct, [("call", call)])
        async with new_client() as client:
            await planner_ms(client, upstreams, 2)
            plans = await planner_ms(client, upstreams, n)
        plan_p50 = round(statistics.median(plans), 1)
        rows.append({"target": "planner", "path": "one-step plan", "p50_ms": plan_p50})

    paths = [
        ("pass-through", chat_body("streamer", QUESTION)),
        ("one-step workflow", workflow_body(1, "streamer")),
        ("three-step workflow", workflow_body(3, "streamer")),
    ]
    asyncio.run(direct_and_planner())
    # Servers of their own: a serve started on the run's directory again read the first one's
    # address from the log it appends to, and was never reached.
    tmp = tmp / "ttft"
    tmp.mkdir(exist_ok=True)
    with serve_target(tmp, upstreams) as target:
        asyncio.run(measure_paths(target, paths))
    with distributed_target(tmp, upstreams, options.postgres, options.redis) as target:
        asyncio.run(measure_paths(target, paths))
    report_ttft(rows)
    return rows


def report_ttft(rows: list[dict[str, Any]]) -> None:
    print(f"streamed, {WORD_DELAY_S:g} s a word; p50 over the requests of each:")
    for row in rows:
        if "p50_ms" in row:
            print(f"  {row['target']:12} {row['path']:22} {row['p50_ms']:9.1f} ms")
            continue
        print(
            f"  {row['target']:12} {row['path']:22} first token {row['first_token_p50_ms']:8.1f} ms"
            f"  last token {row['last_token_p50_ms']:8.1f} ms"
        )
    by = {(r["target"], r["path"]): r for r in rows}
    planner = by[("planner", "one-step plan")]["p50_ms"]
    direct = by[("direct", "call")]["first_token_p50_ms"]
    for target, margin in TTFT_MARGIN_MS.items():
        workflow = by.get((target, "one-step workflow"))
        if workflow is None:
            continue
        bound = planner + direct + margin
        first = workflow["first_token_p50_ms"]
        verdict = "within" if first <= bound else "OVER"
        print(
            f"  {target}: one-step first token {first:.1f} ms against planner {planner:.1f} + "
            f"direct first token {direct:.1f} + {margin:g} = {bound:.1f} ms: {verdict}"
        )


def report(phase: Phase) -> None:
    row = phase.summary()
    print(
        f"{phase.path:44} {phase.mode:10} n={phase.requests:<5} c={phase.concurrency:<4} "
        f"p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f}  p99 {row['p99_ms']:8.2f}  "
        f"{row['per_second']:7.1f}/s  wall {phase.wall_s:6.2f} s  "
        f"server CPU {phase.server_cpu_ms_per_request:6.2f} ms/req  failures {phase.failures}",
        flush=True,
    )
    for reason in phase.failure_reasons:
        print(f"    failed: {reason}", flush=True)


def run_all(options: argparse.Namespace, upstreams: Upstreams, tmp: Path) -> list[Phase]:
    fast_pass = chat_body("fast", QUESTION)
    slow_pass = chat_body("slow", QUESTION)
    workflows = [
        ("one-step workflow", workflow_body(1, "fast")),
        ("three-step workflow", workflow_body(3, "fast")),
    ]
    burst = options.burst
    phases: list[Phase] = []
    if "direct" in options.only:
        direct = Target("direct", f"{upstreams.instant.base_url}/chat/completions", [])
        phases += asyncio.run(measure_target(direct, options, [("fast", fast_pass)], []))
        # The floor of the bursts: the same calls straight to the one-second provider, from
        # this client, in this run (the client's own time for 500 is not nothing).
        floor = Target("direct", f"{upstreams.slow.base_url}/chat/completions", [])
        extra = [("1 s provider", "burst", slow_pass, burst, 0.0)]
        phases += asyncio.run(measure_target(floor, options, [], extra))
    if "litellm" in options.only and options.litellm_venv:
        with litellm_target(tmp, upstreams, options.litellm_venv) as target:
            phases += asyncio.run(
                measure_target(
                    target,
                    options,
                    [("pass-through", fast_pass)],
                    [("pass-through, 1 s provider", "burst", slow_pass, burst, 0)],
                )
            )
    if "serve" in options.only:
        with serve_target(tmp, upstreams) as target:
            phases += asyncio.run(
                measure_target(
                    target,
                    options,
                    [("pass-through", fast_pass), *workflows],
                    [
                        ("pass-through, 1 s provider", "burst", slow_pass, burst, 0),
                        (
                            "one-step workflow, 1 s provider",
                            "burst",
                            workflow_body(1, "slow"),
                            burst,
                            0,
                        ),
                    ],
                )
            )
    if "tracing" in options.only:
        phases += run_tracing(options, upstreams, tmp)
    if "distributed" in options.only:
        with distributed_target(tmp, upstreams, options.postgres, options.redis) as target:
            sustained = ("pass-through", "sustained", fast_pass, options.in_flight, options.sustain)
            phases += asyncio.run(
                measure_target(
                    target,
                    options,
                    [("pass-through", fast_pass), *workflows],
                    [sustained] if options.sustain else [],
                )
            )
    return phases


MEDIAN_FIELDS = ("p50_ms", "p95_ms", "p99_ms", "per_second", "wall_s", "server_cpu_ms_per_request")


def medians(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per path and mode, the median of each figure over the runs (a shared machine's speed
    drifts between runs; one run's figures can be a lucky or an unlucky draw)."""
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for row in run:
            rows.setdefault((row["path"], row["mode"]), []).append(row)
    merged = []
    for (path, mode), same in rows.items():
        row = {"path": path, "mode": mode, "runs": len(same)}
        row |= {"concurrency": same[0]["concurrency"], "requests": same[0]["requests"]}
        row |= {f: round(statistics.median(r[f] for r in same), 2) for f in MEDIAN_FIELDS}
        row["failures"] = sum(r["failures"] for r in same)
        merged.append(row)
    return merged


def report_medians(rows: list[dict[str, Any]]) -> None:
    print(f"median of {rows[0]['runs']} measurements of each:" if rows else "no runs")
    for row in rows:
        print(
            f"{row['path']:44} {row['mode']:10} p50 {row['p50_ms']:8.2f} ms  "
            f"p95 {row['p95_ms']:8.2f}  p99 {row['p99_ms']:8.2f}  {row['per_second']:7.1f}/s  "
            f"wall {row['wall_s']:6.2f} s  server CPU {row['server_cpu_ms_per_request']:6.2f} "
            f"ms/req  failures {row['failures']}",
            flush=True,
        )


def write_chart(rows: list[dict[str, Any]], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sequential = [r for r in rows if r["mode"] == "sequential"]
    loaded = [r for r in rows if r["mode"] == "in-flight"]
    if not sequential or not loaded:  # a run of time to first token only
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    left.barh([r["path"] for r in sequential], [r["p50_ms"] for r in sequential])
    left.set_xlabel("sequential p50 latency (ms)")
    right.barh([r["path"] for r in loaded], [r["per_second"] for r in loaded])
    right.set_xlabel(f"requests per second, {loaded[0]['concurrency']} in flight")
    for axis in (left, right):
        axis.invert_yaxis()
        axis.grid(True, axis="x", alpha=0.3)
    chart = out / "overhead.png"
    fig.savefig(chart, dpi=120)
    plt.close(fig)
    return chart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=200, help="requests one at a time")
    parser.add_argument("--requests", type=int, default=500, help="requests of the loaded runs")
    parser.add_argument("--in-flight", type=int, default=50, help="concurrency of those")
    parser.add_argument("--burst", type=int, default=500, help="1-s calls sent all at once")
    parser.add_argument(
        "--sustain", type=float, default=60, help="seconds of distributed pass-through in flight"
    )
    parser.add_argument(
        "--litellm-venv", type=Path, help="a virtual environment with litellm[proxy] installed"
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "CONDUCTOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1/postgres"
        ),
        help="a PostgreSQL server where this user may create a database",
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis: broker")
    parser.add_argument(
        "--only", default=",".join(TARGETS), help=f"targets to run, of {', '.join(TARGETS)}"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="whole runs; the figures are their medians"
    )
    parser.add_argument(
        "--ttft-requests", type=int, default=20, help="streamed requests per path (ttft)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "orchestration")
    options = parser.parse_args()
    if options.repeat < 1:
        parser.error("--repeat must be at least 1")
    options.only = set(options.only.split(","))
    if unknown := options.only - set(TARGETS):
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if options.litellm_venv:
        if not (options.litellm_venv / "bin" / "litellm").exists():
            parser.error(f"no litellm in {options.litellm_venv}: pip install litellm[proxy] there")
        python = str(options.litellm_venv / "bin" / "python")
        if subprocess.run([python, "-c", "import httptools"], check=False).returncode:
            # uvicorn's fast HTTP parser, which conductor's servers use: without it LiteLLM's
            # proxy would parse HTTP in pure Python and lose for a reason not its own.
            parser.error(f"no httptools in {options.litellm_venv}: pip install httptools there")
    options.out.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs; targets: {', '.join(t for t in TARGETS if t in options.only)}")

    upstreams = Upstreams(
        FakeUpstream(),
        FakeUpstream("--latency", "1"),
        FakeUpstream("--responder", "plans"),
        FakeUpstream("--word-delay", str(WORD_DELAY_S)),
    )
    tmp = Path(tempfile.mkdtemp(prefix="conductor-overhead-"))
    runs: list[list[dict[str, Any]]] = []
    ttft_runs: list[list[dict[str, Any]]] = []
    try:
        for number in range(options.repeat):
            if options.repeat > 1:
                print(f"run {number + 1} of {options.repeat}", flush=True)
            directory = tmp / f"run-{number + 1}"  # logs and databases of its own
            directory.mkdir()
            runs.append([p.summary() for p in run_all(options, upstreams, directory)])
            if "ttft" in options.only:
                ttft_runs.append(run_ttft(options, upstreams, directory))
    finally:
        upstreams.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    phases = medians(runs)
    if options.repeat > 1:
        report_medians(phases)
    # Each run measured both twice: the ratio of the medians over every measurement.
    report_tracing([row for run in runs for row in run])
    results = {
        "cpus": os.cpu_count(),
        "options": {k: str(v) for k, v in vars(options).items()},
        "phases": phases,
        "runs": runs,
        "time_to_first_token": ttft_runs,
    }
    (options.out / "results.json").write_text(json.dumps(results, indent=2))
    chart = write_chart(phases, options.out)
    print(f"wrote {options.out / 'results.json'}" + (f" and {chart}" if chart else ""))


if __name__ == "__main__":
    main()
