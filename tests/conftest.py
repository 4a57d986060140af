"""Shared fixtures. Real servers only: a missing Postgres fails the run, it is never skipped."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from conductor.traces.db import make_engine, normalize_url, redact_url

pytest_plugins = ["fakes.fixtures", "fakes.brokers"]

DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

# -- databases ------------------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file in a directory that does not exist yet (make_engine must create it)."""
    return f"sqlite:///{tmp_path / 'data' / 'conductor.db'}"


@contextmanager
def _fresh_database() -> Iterator[str]:
    """A fresh database ``conductor_test_<random>`` on the test server, dropped afterwards."""
    server = os.environ.get("CONDUCTOR_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL)
    name = f"conductor_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(server).execution_options(isolation_level="AUTOCOMMIT")
    reason: str | None = None
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:
        admin.dispose()
        reason = str(getattr(exc, "orig", exc)).strip()
    if reason is not None:  # failing outside `except` reports the message, not a traceback
        pytest.fail(
            f"cannot reach the test PostgreSQL server at {redact_url(server)}: {reason}\n"
            "Start one (e.g. `docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust "
            "postgres:16`) or set CONDUCTOR_TEST_POSTGRES_URL to a server where this user may "
            "CREATE DATABASE. Run `pytest -m 'not postgres'` to leave these tests out knowingly.",
            pytrace=False,
        )
    try:
        yield normalize_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A database of this test's own on the test PostgreSQL server."""
    with _fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def module_postgres_url() -> Iterator[str]:
    """A database shared by the tests of one module (for costly set-ups such as a stack)."""
    with _fresh_database() as url:
        yield url


@pytest.fixture(
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
def database_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once on SQLite and once on Postgres (marked ``postgres``)."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
