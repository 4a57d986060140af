"""``conductor db``: database maintenance."""

from __future__ import annotations

import typer

from conductor_adapters.settings import get_settings
from conductor_adapters.store.db import redact_url, upgrade

db_app = typer.Typer(help="Trace database maintenance.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the trace database at CONDUCTOR_DATABASE_URL to the latest schema."""
    url = get_settings().database_url
    upgrade(url)
    typer.echo(f"database at {redact_url(url)} is up to date")


@db_app.command("wait")
def db_wait(
    timeout_s: float = typer.Option(
        900.0, "--timeout", min=0, help="Seconds to wait before giving up (exit 1)."
    ),
    interval_s: float = typer.Option(5.0, "--interval", min=0.1, help="Seconds between checks."),
) -> None:
    """Wait until the database at CONDUCTOR_DATABASE_URL answers and holds this release's schema
    (what `conductor db upgrade` makes): for a container that must not start before it."""
    import time

    from conductor.errors import ConductorError
    from conductor_adapters.store.db import check_schema, wait_for_database

    url = get_settings().database_url
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # At most what is left: an unreachable server must not hold it past its deadline.
            wait_for_database(url, timeout_s=max(0.1, min(30.0, deadline - time.monotonic())))
            check_schema(url)
        except ConductorError as exc:
            if time.monotonic() + interval_s > deadline:
                typer.echo(f"gave up after {timeout_s:g} s: {exc}", err=True)
                raise typer.Exit(1) from None
            typer.echo(f"waiting: {exc}", err=True)
            time.sleep(interval_s)
        else:
            typer.echo(f"database at {redact_url(url)} holds this release's schema")
            return
