"""``conductor traces``: the trace database as training data."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import typer

from conductor.errors import ConfigurationError
from conductor_adapters.settings import get_settings, load_variants
from conductor_adapters.store.db import check_schema, make_engine, redact_url

traces_app = typer.Typer(help="Export traces for training.", no_args_is_help=True)


@traces_app.command("export")
def export(
    out: str = typer.Option(..., "--out", "-o", help="The JSONL file to write."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's workflows."),
    since: str | None = typer.Option(
        None, "--since", help="Only workflows created at or after this ISO date/time."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="At most this many rows."),
    as_suite: bool = typer.Option(
        False,
        "--as-suite",
        help="Write labelled workflows as suite items (question, reference answer, kind) for "
        "`conductor train --suite F.jsonl` and `conductor eval --suite F.jsonl`.",
    ),
) -> None:
    """Write one training row per finished workflow: the Conductor prompt, its output, the
    reward (feedback) when known, the pool, the question, the reference answer when known, and
    the steps that ran (worker, who answered, cost) with the workflow's total cost."""
    from conductor_trainer.export import SUITE_KINDS, export_rows, suite_row

    try:
        start = datetime.fromisoformat(since) if since else None
    except ValueError:
        raise ConfigurationError(f"--since {since!r} is not an ISO date or date-time") from None
    settings = get_settings()
    check_schema(settings.database_url)
    engine = make_engine(settings.database_url)
    target = Path(out)
    partial = target.with_name(target.name + ".partial")
    count = skipped = 0
    try:
        with partial.open("w", encoding="utf-8") as f:
            for row in export_rows(
                engine, load_variants(settings), tenant=tenant, since=start, limit=limit
            ):
                written = suite_row(row) if as_suite else row
                if written is None:
                    skipped += 1
                    continue
                f.write(json.dumps(written, ensure_ascii=False) + "\n")
                count += 1
        os.replace(partial, target)  # readers never see half an export
    finally:
        partial.unlink(missing_ok=True)
        engine.dispose()
    typer.echo(f"exported {count} workflows from {redact_url(settings.database_url)} to {target}")
    if as_suite and not count:
        typer.echo("warning: no labelled workflows: the suite file is empty", err=True)
    if skipped:
        typer.echo(
            f"skipped {skipped} without a 'reference' label or with a 'kind' label other than "
            f"{' or '.join(SUITE_KINDS)}"
        )
