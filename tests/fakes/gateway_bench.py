"""What the gateway benchmarks set up alike: a fake provider in its own process, a pool of one
worker on it (``bench``), and a Redis key prefix of the run's own, removed afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from fakes.gateway_process import write_pool_file

TESTS = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class GatewayBench:
    base_url: str  # the fake provider's, ending in /v1
    workdir: Path
    env: dict[str, str]  # broker, Redis, key prefix and pool file, for the gateway and clients


@contextmanager
def gateway_bench(latency_s: float, *, broker_url: str, redis_url: str) -> Iterator[GatewayBench]:
    workdir = Path(tempfile.mkdtemp(prefix="conductor-bench-"))
    prefix = f"conductor-bench-{uuid.uuid4().hex[:8]}:"
    fake = subprocess.Popen(
        [sys.executable, "-m", "fakes.serve", "openai", "--latency", str(latency_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        text=True,
    )
    try:
        assert fake.stdout is not None
        base_url = fake.stdout.readline().strip()
        pool_file = write_pool_file(
            workdir / "pool.yaml",
            {"bench": {"provider": "openai-compatible", "model": "fake", "base_url": base_url}},
        )
        env = {
            "CONDUCTOR_BROKER_URL": broker_url,
            "CONDUCTOR_REDIS_URL": redis_url,
            "CONDUCTOR_REDIS_PREFIX": prefix,
            "CONDUCTOR_POOL_FILE": str(pool_file),
        }
        yield GatewayBench(base_url, workdir, env)
    finally:
        fake.terminate()
        fake.wait(timeout=10)
        cleanup = redis.Redis.from_url(redis_url)
        keys = list(cleanup.scan_iter(match=f"{prefix}*"))
        if keys:
            cleanup.delete(*keys)
        cleanup.close()
