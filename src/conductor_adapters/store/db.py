"""Database engines, migrations and the start-up wait for the trace database.

Supported URLs: ``sqlite:///PATH`` (embedded mode, the default) and Postgres through psycopg 3.
A plain ``postgresql://`` (or ``postgres://``) URL, as ``psql``, Heroku and most operators
write it, is switched to ``postgresql+psycopg://`` transparently: psycopg 3 is the driver this
project installs, and SQLAlchemy's default for the bare scheme (psycopg2) is not installed.
An explicit driver (``postgresql+psycopg2://``, ``postgresql+asyncpg://``) is left alone.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import StaticPool

from conductor.errors import ConfigurationError, DatabaseUnavailableError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Serialises concurrent `upgrade` calls (several replicas starting at once) on Postgres.
_MIGRATION_LOCK_ID = 0x436F6E64  # "Cond"
_PASSWORD_IN_URL = re.compile(r"(://[^:/@]*:)[^@]*@")


def redact_url(url: str | URL) -> str:
    """The URL with its password replaced by ``***``, safe for logs and error messages."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except ArgumentError:
        return _PASSWORD_IN_URL.sub(r"\1***@", str(url))
    return parsed.render_as_string(hide_password=True)


def normalize_url(url: str | URL) -> URL:
    """Parse ``url``, switching the bare Postgres scheme to psycopg 3 (see module docstring)."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(
            f"invalid database URL {redact_url(url)!r}: use sqlite:///PATH or "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DBNAME"
        ) from exc
    if parsed.drivername in {"postgresql", "postgres"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in {"sqlite", "postgresql"}:
        raise ConfigurationError(
            f"unsupported database {redact_url(parsed)!r}: use SQLite or PostgreSQL"
        )
    return parsed


def _is_memory_sqlite(url: URL) -> bool:
    return url.database in {None, "", ":memory:"} or "mode=memory" in str(url.query)


def make_engine(url: str | URL) -> Engine:
    """A sync engine configured for this project's use of SQLite or Postgres."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "postgresql":
        # Ten kept rather than SQLAlchemy's five: an aggregator's threads and the API's
        # to_thread workers often run more than five transactions at once, and each one past
        # the kept connections opened and closed its own (a PostgreSQL connection costs a
        # backend process and milliseconds of CPU on both sides). At most 15, as before.
        engine = create_engine(parsed, pool_size=10, max_overflow=5)
        event.listen(engine, "checkout", _ping_if_idle)
        event.listen(engine, "checkin", _note_use)
        return engine

    # No rollback when a connection goes back to the pool: every use ends its own transaction
    # (``begin`` commits, ``connect`` rolls back on close), and the extra call is paid per write.
    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": 30},
        "pool_reset_on_return": None,
    }
    if _is_memory_sqlite(parsed):
        kwargs["poolclass"] = StaticPool  # one shared connection, or each sees an empty DB
    else:
        assert parsed.database is not None
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, **kwargs)
    event.listen(engine, "connect", _sqlite_on_connect)
    return engine


# A pooled connection idle longer than this is pinged before use: one a database restart or a
# proxy's idle timeout closed meanwhile is replaced rather than failing the caller's work. A
# ping on every checkout (SQLAlchemy's pool_pre_ping) cost a round trip and a fifth of a
# millisecond of CPU per transaction under load, where connections are never idle this long
# (a connection the database dropped within it fails its caller once, and SQLAlchemy then
# replaces every connection of the pool that is older).
IDLE_PING_S = 2.0


def _note_use(_dbapi_connection: Any, record: Any) -> None:
    record.info["returned_at"] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    returned_at = record.info.get("returned_at")
    if returned_at is None or time.monotonic() - returned_at < IDLE_PING_S:
        return  # new, or in use a moment ago
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        dbapi_connection.rollback()  # the ping's own transaction
    except Exception as exc:
        # The pool discards this connection and checks out another (three tries).
        raise DisconnectionError(f"a pooled connection is gone: {exc}") from exc


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    """SQLite leaves foreign keys off per connection; WAL lets readers run beside a writer.
    In WAL mode, synchronous=NORMAL syncs the log at checkpoints rather than at every commit:
    a commit survives the process crashing (it is in the operating system's hands), only a
    power cut or a kernel crash can undo the last ones, and the database stays consistent. A
    commit's fsync was a tenth of an embedded workflow's latency."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic config built in code, so no alembic.ini is needed at run time."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        rendered = normalize_url(url).render_as_string(hide_password=False)
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def upgrade(url: str | URL, revision: str = "head") -> None:
    """Migrate the database to ``revision``; running it again when up to date does nothing."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:id)"), {"id": _MIGRATION_LOCK_ID}
                )
            config = alembic_config(url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def ensure_database(url: str | URL) -> None:
    """Create the Postgres database named in ``url`` if it does not exist (local set-ups)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "postgresql" or not parsed.database:
        return
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,63}", parsed.database):
        raise ConfigurationError(
            f"database name {parsed.database!r}: create it yourself, or use letters, digits, "
            "_ and -"
        )
    wait_for_database(parsed.set(database="postgres"))
    admin = make_engine(parsed.set(database="postgres"))
    try:
        with admin.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
            exists = connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": parsed.database}
            ).scalar()
            if not exists:
                connection.execute(text(f'CREATE DATABASE "{parsed.database}"'))
    finally:
        admin.dispose()


def check_schema(url: str | URL) -> None:
    """Refuse to run on a database whose schema is not the latest one (services do not migrate
    on their own: one ``conductor db upgrade`` per release, not one per replica)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
    if current != head:
        raise ConfigurationError(
            f"the database {redact_url(url)} is at schema {current or 'none'}, not {head}: "
            "run `conductor db upgrade` first"
        )


def database_down(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached or used now (refused or reset
    connections, a full pool, a full disk or a lock on SQLite), rather than that a statement
    is wrong: a client is told to try again later (503), not that the server failed (500)."""
    return isinstance(
        exc,
        (
            DatabaseUnavailableError,
            OperationalError,
            InterfaceError,
            DisconnectionError,
            PoolTimeoutError,
        ),
    )


def wait_for_database(url: str | URL, timeout_s: float = 30.0) -> None:
    """Block until the database answers ``SELECT 1``; start-up waits on it rather than crash.

    Raises DatabaseUnavailableError naming the URL (password hidden) and the last error.
    """
    engine = make_engine(url)
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    try:
        while True:
            try:
                with engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
                return
            except SQLAlchemyError as exc:
                last = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 2.0)
    finally:
        engine.dispose()
    raise DatabaseUnavailableError(_unavailable_message(url, timeout_s, last))


def _unavailable_message(url: str | URL, timeout_s: float, exc: SQLAlchemyError) -> str:
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    reason = cause[0] if cause else type(exc).__name__
    parsed = normalize_url(url)
    if parsed.password:
        reason = reason.replace(str(parsed.password), "***")
    return (
        f"cannot connect to the database {redact_url(parsed)} within {timeout_s:g}s: {reason}. "
        "Start the database server, or point CONDUCTOR_DATABASE_URL at a reachable one."
    )
