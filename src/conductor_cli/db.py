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
