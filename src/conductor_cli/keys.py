"""``conductor keys``: API keys of the public API, one tenant each."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from conductor_adapters.store.keys import KeyLimits

keys_app = typer.Typer(help="API keys: create, list, revoke.", no_args_is_help=True)


def _engine() -> Engine:
    from conductor_adapters.settings import get_settings
    from conductor_adapters.store.db import check_schema, make_engine

    url = get_settings().database_url
    check_schema(url)
    return make_engine(url)


RPM = typer.Option(None, "--rpm", min=1, help="Requests per minute. Default: no limit.")
TPM = typer.Option(
    None, "--tpm", min=1, help="Tokens per minute (of workflows that ended). Default: no limit."
)
CONCURRENCY = typer.Option(
    None, "--concurrency", min=1, help="Workflows queued or running at once. Default: no limit."
)
BUDGET = typer.Option(None, "--budget-usd", min=0.0, help="USD per --budget-period.")
PERIOD = typer.Option(None, "--budget-period", help="day or month (UTC), with --budget-usd.")


def _limits(
    rpm: int | None,
    tpm: int | None,
    concurrency: int | None,
    budget: float | None,
    period: str | None,
) -> KeyLimits:
    from pydantic import ValidationError

    from conductor.errors import InvalidRequest
    from conductor_adapters.store.keys import KeyLimits

    try:
        return KeyLimits(
            rpm_limit=rpm,
            tpm_limit=tpm,
            max_concurrent=concurrency,
            budget_usd=budget,
            budget_period=period,
        )
    except ValidationError as exc:
        reasons = "; ".join(e["msg"] for e in exc.errors())
        raise InvalidRequest(f"limits: {reasons}") from None


@keys_app.command("create")
def create(
    tenant: str = typer.Option(..., "--tenant", help="The tenant the key acts for."),
    pool: str | None = typer.Option(
        None, "--pool", help="Comma-separated workers the key may use. Default: every worker."
    ),
    name: str = typer.Option("", "--name", help="A label for listings."),
    rpm: int | None = RPM,
    tpm: int | None = TPM,
    concurrency: int | None = CONCURRENCY,
    budget: float | None = BUDGET,
    period: str | None = PERIOD,
) -> None:
    """Make a key and print it once: it is stored only as a hash and cannot be shown again."""
    from conductor_adapters.settings import get_settings, load_pool
    from conductor_adapters.store.keys import create_key

    limits = _limits(rpm, tpm, concurrency, budget, period)
    allowed = [w.strip() for w in pool.split(",") if w.strip()] if pool is not None else None
    known = {w.name for w in load_pool(get_settings()).workers}
    engine = _engine()
    try:
        made = create_key(
            engine, tenant, name=name, allowed_pool=allowed, known_workers=known, limits=limits
        )
    finally:
        engine.dispose()
    typer.echo(made.secret)
    typer.echo(
        f"key {made.key.id} for tenant {tenant!r} made; keep it now, it is not shown again",
        err=True,
    )


@keys_app.command("list")
def list_(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's keys."),
) -> None:
    """One JSON object per key (never its secret)."""
    from conductor_adapters.store.keys import list_keys

    engine = _engine()
    try:
        keys = list_keys(engine, tenant)
    finally:
        engine.dispose()
    for key in keys:
        typer.echo(json.dumps(key.model_dump(mode="json")))


@keys_app.command("limit")
def limit(
    key_id: str = typer.Argument(..., help="The key's id, as `keys list` shows it."),
    rpm: int | None = RPM,
    tpm: int | None = TPM,
    concurrency: int | None = CONCURRENCY,
    budget: float | None = BUDGET,
    period: str | None = PERIOD,
) -> None:
    """Replace a key's limits with these (an option left out: no limit). Servers apply them
    within a second (they reuse a key check for that long)."""
    from conductor_adapters.store.keys import set_limits

    limits = _limits(rpm, tpm, concurrency, budget, period)
    engine = _engine()
    try:
        key = set_limits(engine, key_id, limits)
    finally:
        engine.dispose()
    typer.echo(json.dumps(key.model_dump(mode="json")))


@keys_app.command("webhook")
def webhook(
    key_id: str = typer.Argument(..., help="The key's id, as `keys list` shows it."),
    url: str | None = typer.Option(
        None, "--url", help="Where its jobs' outcomes go unless a job names its callback_url."
    ),
    rotate: bool = typer.Option(False, "--rotate", help="Make a new signing secret."),
) -> None:
    """Set a key's webhooks: its default URL, and the secret its deliveries are signed with
    (Standard Webhooks). A secret made here is printed once; receivers verify with it."""
    from conductor_adapters.store.keys import set_webhook

    engine = _engine()
    try:
        key, secret = set_webhook(engine, key_id, url, new_secret=rotate)
    finally:
        engine.dispose()
    if secret is not None:
        typer.echo(secret)
        typer.echo(f"signing secret of key {key_id}: keep it now, it is not shown again", err=True)
    typer.echo(json.dumps(key.model_dump(mode="json")), err=secret is not None)


@keys_app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., help="The key's id, as `keys list` shows it."),
) -> None:
    """Revoke a key at once: requests with it are refused from now on."""
    from conductor.errors import InvalidRequest
    from conductor_adapters.store.keys import revoke_key

    engine = _engine()
    try:
        revoked = revoke_key(engine, key_id)
    finally:
        engine.dispose()
    if not revoked:
        raise InvalidRequest(f"no live key {key_id!r}")
    typer.echo(f"key {key_id} revoked", err=True)
