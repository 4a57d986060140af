"""Fixtures for the real Redis and RabbitMQ, isolated per test run; never mocked, never skipped.

Redis: every test gets its own key prefix, and its keys are deleted afterwards. RabbitMQ: the
session gets its own virtual host (made with rabbitmqctl, or given in CONDUCTOR_TEST_AMQP_URL),
so queues named ``gateway.<vendor>`` never collide with another run's.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("CONDUCTOR_TEST_REDIS_URL", DEFAULT_TEST_REDIS_URL)
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(
            f"cannot reach the test Redis at {url}: {exc}\nStart one (`redis-server --daemonize "
            "yes`) or set CONDUCTOR_TEST_REDIS_URL. Run `pytest -m 'not broker'` to leave "
            "the queue tests out knowingly.",
            pytrace=False,
        )
    finally:
        client.close()
    return url


@contextmanager
def _key_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"conductor-test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    with _key_prefix(redis_url) as prefix:
        yield prefix


@pytest.fixture(scope="module")
def module_redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix shared by the tests of one module; its keys are deleted afterwards."""
    with _key_prefix(redis_url) as prefix:
        yield prefix


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """A RabbitMQ virtual host for this session, deleted afterwards."""
    given = os.environ.get("CONDUCTOR_TEST_AMQP_URL")
    if given:
        yield given
        return
    ctl = shutil.which("rabbitmqctl")
    vhost = f"conductor-test-{uuid.uuid4().hex[:12]}"
    made = ctl is not None and _rabbitmqctl(ctl, "add_vhost", vhost)
    if not made or ctl is None:
        pytest.fail(
            "cannot create a RabbitMQ virtual host: rabbitmqctl is missing or failed.\n"
            "Run RabbitMQ on 127.0.0.1:5672 with rabbitmqctl on PATH, or set "
            "CONDUCTOR_TEST_AMQP_URL=amqp://user:pass@host:5672/VHOST to a vhost this run "
            "may use alone. Run `pytest -m 'not broker'` to leave the queue tests out knowingly.",
            pytrace=False,
        )
    _rabbitmqctl(ctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    finally:
        _rabbitmqctl(ctl, "delete_vhost", vhost)


def _rabbitmqctl(ctl: str, *args: str) -> bool:
    done = subprocess.run([ctl, "-q", *args], capture_output=True, text=True, timeout=60)
    return done.returncode == 0


def private_redis_server(port: int) -> subprocess.Popen[bytes]:
    """A Redis of the test's own on ``port``, without persistence: killed and started again, it
    comes back empty, as a restarted Redis without a volume does. The caller stops it."""
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not _answers_ping(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"redis-server on port {port} did not start (is it installed?)")
        time.sleep(0.05)
    return process


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
