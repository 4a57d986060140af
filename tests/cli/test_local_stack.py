"""The local stack: its sizing of llama.cpp engines (their threads never outnumber the cores),
and its processes' start when a port they were given is taken."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from conductor_cli import local_stack
from conductor_cli.local_stack import ServiceProcess, engine_threads, free_port

from fakes.gateway_process import write_pool_file


@pytest.mark.parametrize(
    ("engines", "cpus", "threads"),
    [(1, 2, 2), (2, 2, 1), (3, 2, 1), (2, 8, 4), (3, 8, 2), (0, 4, 4)],
)
def test_each_engine_gets_its_share_of_the_cores(engines: int, cpus: int, threads: int) -> None:
    assert engine_threads(engines, cpus) == threads


@pytest.mark.processes
@pytest.mark.broker
def test_a_process_whose_metrics_port_was_taken_starts_again_on_another(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a port another process listens on, handed out as if free (the race between a
    # port's choice and the bind, lost), then a free one
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1], free_port()]
        monkeypatch.setattr(local_stack, "free_port", lambda: ports.pop(0))
        pool = write_pool_file(
            tmp_path / "pool.yaml",
            {"w": {"provider": "openai-compatible", "model": "m", "base_url": "http://x"}},
        )
        env = {
            "CONDUCTOR_BROKER_URL": redis_url,
            "CONDUCTOR_REDIS_URL": redis_url,
            "CONDUCTOR_REDIS_PREFIX": redis_prefix,
            "CONDUCTOR_POOL_FILE": str(pool),
        }
        gateway = ServiceProcess(
            "gateway", ["-Q", "gateway.test"], tmp_path / "gateway.log", env, serves_metrics=True
        )
        # When it starts
        try:
            gateway.start(ready_timeout_s=60)
            # Then it runs on the second port, after a first start that found the port taken
            assert gateway.running
            assert gateway.metrics_port not in (None, taken.getsockname()[1])
            assert "Address already in use" in gateway.tail(20_000)
        finally:
            gateway.stop()
