"""Which servers the tests use, and which tiers this machine can run; registered from
tests/conftest.py via pytest_plugins.

PostgreSQL and Redis: the server at the default address when one answers there (these machines
and CI run them), else one this test process starts for the session (``own_servers``), so a
fresh machine needs nothing running. ``CONDUCTOR_TEST_SERVERS`` changes that: ``own`` always
starts them (to try that path on a machine with servers), ``running`` never does (a missing
server fails the tests that need it). A URL given in ``CONDUCTOR_TEST_POSTGRES_URL`` or
``CONDUCTOR_TEST_REDIS_URL`` is used as it is.

Four tiers need what no wheel ships: ``rabbitmq`` (the RabbitMQ-broker variants: a RabbitMQ
running, or installed so that the session starts one), ``browser`` (the trace viewer in
Debian's chromium), ``curl`` (the docs' curl examples, run with curl) and ``codex`` (the
Codex CLI from npm, ``codex_binary``, driven against the API). Where this machine
lacks what one needs, its tests are deselected, unless ``-m`` names the tier or
``CONDUCTOR_TEST_REQUIRE`` does (CI names them all: there they must run). The
run's summary says which servers were used and which tiers ran or were left out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from fakes.own_servers import (
    OwnServer,
    ServerStartError,
    port_open,
    rabbitmq_scripts,
    start_postgres,
    start_rabbitmq,
    start_redis,
)

MODE_ENV = "CONDUCTOR_TEST_SERVERS"
REQUIRE_ENV = "CONDUCTOR_TEST_REQUIRE"
# The controller's decisions, handed to the xdist workers it starts (they inherit its
# environment), so that every worker deselects the same tests.
DECIDED_ENV = "CONDUCTOR_TEST_TIERS_DECIDED"
WORKER_OUTPUT = "conductor_test_servers"
DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
AMQP_HOST, AMQP_PORT = "127.0.0.1", 5672
TIERS = ("rabbitmq", "browser", "curl", "codex", "phoenix")
WHAT = {
    "rabbitmq": "RabbitMQ-broker variants",
    "browser": "browser tests",
    "curl": "tests of the docs' curl examples",
    "codex": "runs of the Codex CLI",
    "phoenix": "tracing tests against Arize Phoenix",
}
# Where CI installs the Codex CLI (npm install --prefix .codex-cli @openai/codex); else one
# named by CONDUCTOR_TEST_CODEX, else one on PATH.
CODEX_PREFIX = ".codex-cli"
CODEX_ENV = "CONDUCTOR_TEST_CODEX"
# Where CI installs Arize Phoenix (a virtual environment of its own: its dependencies are not
# this project's); else the ``phoenix`` command named by CONDUCTOR_TEST_PHOENIX.
PHOENIX_VENV = ".venv-phoenix"
PHOENIX_ENV = "CONDUCTOR_TEST_PHOENIX"


def mode() -> str:
    value = os.environ.get(MODE_ENV, "auto")
    if value not in ("auto", "own", "running"):
        raise pytest.UsageError(f"{MODE_ENV}={value!r}: expected auto, own or running")
    return value


@dataclass
class _Report:
    """What this process used and left out; merged from the xdist workers by the controller."""

    used: dict[str, list[str]]
    started_s: dict[str, list[float]]
    deselected: dict[str, int]
    ran: dict[str, int]
    failed: dict[str, int]

    def add_used(self, name: str, how: str, started_s: float | None = None) -> None:
        self.used.setdefault(name, [])
        if how not in self.used[name]:
            self.used[name].append(how)
        if started_s is not None:  # one per xdist worker that started its own
            self.started_s.setdefault(name, []).append(round(started_s, 2))

    def describe(self, name: str) -> str:
        how = "; ".join(self.used[name])
        times = self.started_s.get(name)
        return f"{how}, started in {' and '.join(f'{t} s' for t in times)}" if times else how


REPORT = _Report(used={}, started_s={}, deselected={}, ran={}, failed={})


@contextmanager
def session_server(name: str, default_url: str, given: str | None) -> Iterator[str]:
    """The URL of the server the session's tests use: the given one, else the one at the
    default address when it accepts connections, else one started here (stopped at the end)."""
    chosen = mode()
    if given and chosen != "own":
        REPORT.add_used(name, f"{_address(given)} (given)")
        yield given
        return
    address = urlsplit(default_url)
    host, port = address.hostname or "127.0.0.1", address.port or 0
    if chosen != "own" and port_open(host, port):
        REPORT.add_used(name, f"the running server at {host}:{port}")
        yield default_url
        return
    if chosen == "running":
        REPORT.add_used(name, f"none: nothing at {host}:{port} ({MODE_ENV}=running)")
        yield default_url  # the fixture's own check fails with what to start
        return
    server = _start(name)
    REPORT.add_used(name, f"own, {server.source}", server.started_s)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The test PostgreSQL server's URL: CONDUCTOR_TEST_POSTGRES_URL, else the local server,
    else one this session starts."""
    given = os.environ.get("CONDUCTOR_TEST_POSTGRES_URL")
    with session_server("PostgreSQL", DEFAULT_TEST_POSTGRES_URL, given) as url:
        yield url


def _start(name: str) -> OwnServer:
    start = {"PostgreSQL": start_postgres, "Redis": start_redis, "RabbitMQ": start_rabbitmq}
    try:
        return start[name]()
    except ServerStartError as exc:
        reason = str(exc)
    pytest.fail(
        f"no {name} is running at its default address, and the test session could not start "
        f"one of its own: {reason}",
        pytrace=False,
    )


def _address(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


# -- tiers -----------------------------------------------------------------------------------


def _rabbitmq_here() -> str | None:
    """None when the RabbitMQ variants can run here, else why not."""
    if os.environ.get("CONDUCTOR_TEST_AMQP_URL"):
        return None
    if mode() != "own" and port_open(AMQP_HOST, AMQP_PORT) and shutil.which("rabbitmqctl"):
        return None
    if mode() != "running" and rabbitmq_scripts() is not None:
        return None
    return f"no RabbitMQ at {AMQP_HOST}:{AMQP_PORT} (with rabbitmqctl) and none installed"


def _browser_here() -> str | None:
    if shutil.which("chromium"):
        return None
    return "Debian's chromium is not installed (apt-get install chromium)"


def _curl_here() -> str | None:
    return None if shutil.which("curl") else "curl is not installed (apt-get install curl)"


def codex_binary() -> str | None:
    """The Codex CLI these tests drive, or None."""
    named = os.environ.get(CODEX_ENV)
    if named:
        return named
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    installed = os.path.join(root, CODEX_PREFIX, "node_modules", ".bin", "codex")
    return installed if os.path.exists(installed) else shutil.which("codex")


def _codex_here() -> str | None:
    if codex_binary() is not None:
        return None
    return (
        f"the Codex CLI is not installed (npm install --prefix {CODEX_PREFIX} @openai/codex, "
        f"or name it in {CODEX_ENV})"
    )


def phoenix_binary() -> str | None:
    """The ``phoenix`` command the tracing tests start, or None."""
    named = os.environ.get(PHOENIX_ENV)
    if named:
        return named
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    installed = os.path.join(root, PHOENIX_VENV, "bin", "phoenix")
    return installed if os.path.exists(installed) else None


def _phoenix_here() -> str | None:
    if phoenix_binary() is not None:
        return None
    return (
        f"Arize Phoenix is not installed (python3 -m venv {PHOENIX_VENV} && "
        f"{PHOENIX_VENV}/bin/pip install arize-phoenix, or name its command in {PHOENIX_ENV})"
    )


def _decide(config: pytest.Config) -> dict[str, str]:
    """The tiers this run leaves out, with the reason: decided once, by the controller."""
    decided = os.environ.get(DECIDED_ENV)
    if decided is not None:
        return dict(json.loads(decided))
    required = {name.strip() for name in os.environ.get(REQUIRE_ENV, "").split(",")}
    selected = set(re.findall(r"\w+", config.getoption("markexpr") or ""))
    out: dict[str, str] = {}
    checks = (
        ("rabbitmq", _rabbitmq_here),
        ("browser", _browser_here),
        ("curl", _curl_here),
        ("codex", _codex_here),
        ("phoenix", _phoenix_here),
    )
    for tier, check in checks:
        why_not = check()
        if why_not is not None and tier not in required and tier not in selected:
            out[tier] = why_not
    os.environ[DECIDED_ENV] = json.dumps(out)
    return out


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LEFT_OUT] = _decide(config)


_LEFT_OUT = pytest.StashKey[dict[str, str]]()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"test servers: the running PostgreSQL and Redis, else the session's own ({mode()})"]
    for tier, why in config.stash[_LEFT_OUT].items():
        lines.append(f"tier {tier} left out: {why} (`-m {tier}` runs it where it can)")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # A test on RabbitMQ asks for its vhost; one run on either broker names it a param.
        callspec = getattr(item, "callspec", None)
        on_rabbitmq = callspec is not None and callspec.params.get("broker") == "rabbitmq"
        if on_rabbitmq or "amqp_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rabbitmq)
    left_out = config.stash[_LEFT_OUT]
    if not left_out:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        tiers = [tier for tier in left_out if item.get_closest_marker(tier)]
        for tier in tiers:
            REPORT.deselected[tier] = REPORT.deselected.get(tier, 0) + 1
        (dropped if tiers else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    for tier in TIERS:
        if tier in report.keywords:
            REPORT.ran[tier] = REPORT.ran.get(tier, 0) + 1
            if report.failed:
                REPORT.failed[tier] = REPORT.failed.get(tier, 0) + 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker: hand what it used to the controller
        output[WORKER_OUTPUT] = json.dumps(
            {"used": REPORT.used, "started_s": REPORT.started_s, "deselected": REPORT.deselected}
        )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    raw = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
    if raw is None:
        return
    worker = json.loads(raw)
    for name, hows in worker["used"].items():
        for how in hows:
            REPORT.add_used(name, how)
    for name, times in worker["started_s"].items():
        REPORT.started_s.setdefault(name, []).extend(times)
    for tier, count in worker["deselected"].items():  # every worker deselects the same tests
        REPORT.deselected[tier] = max(REPORT.deselected.get(tier, 0), count)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = [f"{name}: {REPORT.describe(name)}" for name in sorted(REPORT.used)]
    left_out = config.stash[_LEFT_OUT]
    for tier in TIERS:
        ran, dropped = REPORT.ran.get(tier, 0), REPORT.deselected.get(tier, 0)
        what = WHAT[tier]
        if dropped:
            lines.append(
                f"tier {tier}: {dropped} {what} NOT RUN here: {left_out.get(tier, '')}; "
                f"`python -m pytest -m {tier}` runs them where it can (CI does)"
            )
        elif tier in left_out:
            lines.append(f"tier {tier}: none selected; it could not run here: {left_out[tier]}")
        else:
            failed = REPORT.failed.get(tier, 0)
            of_them = f", {failed} failed" if failed else ""
            lines.append(f"tier {tier}: {what} run: {ran}{of_them}")
    terminalreporter.write_sep("=", "test servers and tiers")
    for line in lines:
        terminalreporter.write_line(line)
