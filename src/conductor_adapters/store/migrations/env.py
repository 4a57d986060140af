"""Alembic environment for the Conductor database.

``conductor_adapters.store.db.upgrade`` passes an open connection in ``config.attributes``; the
``alembic`` command line (repo-root alembic.ini) gives a URL instead, or takes it from
``CONDUCTOR_DATABASE_URL``. Batch mode is always on so migrations also run on SQLite, whose
ALTER TABLE cannot change or drop constraints.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy.engine import Connection
from sqlmodel import AutoString, UTCDateTime

from conductor_adapters.store.db import make_engine, normalize_url
from conductor_adapters.store.models import SafeJSON, SafeText, metadata

config = context.config
target_metadata = metadata

if config.config_file_name is not None and config.file_config.has_section("loggers"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("CONDUCTOR_DATABASE_URL")
    if not url:
        raise RuntimeError("set sqlalchemy.url or CONDUCTOR_DATABASE_URL to run migrations")
    return normalize_url(url).render_as_string(hide_password=False)


def _render_item(kind: str, obj: Any, autogen: AutogenContext) -> str | Literal[False]:
    """Render SQLModel's column types as plain SQLAlchemy, so migrations never import them."""
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if kind == "type" and isinstance(obj, SafeJSON):
        # Alembic would render JSONB(astext_type=Text()) without the "sa." prefix.
        autogen.imports.add("from sqlalchemy.dialects import postgresql")
        return 'sa.JSON().with_variant(postgresql.JSONB(), "postgresql")'
    if kind == "type" and isinstance(obj, SafeText):
        return "sa.Text()"
    if kind == "type" and isinstance(obj, AutoString):
        length = getattr(obj.impl, "length", None)
        return f"sa.String(length={length})" if length else "sa.String()"
    return False


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        render_item=_render_item,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        render_as_batch=True,
        render_item=_render_item,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _configure(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
