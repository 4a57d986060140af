"""``conductor traces``: the trace database as training data, and how long it keeps them."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING

import typer

from conductor.errors import ConfigurationError
from conductor_adapters.settings import get_settings, load_variants
from conductor_adapters.store.db import check_schema, make_engine, redact_url

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

    from conductor.variants import Variant
    from conductor_adapters.store.retention import PruneResult, RetentionPolicy, ScopeCount

traces_app = typer.Typer(
    help="Export traces for training; prune those past retention.", no_args_is_help=True
)
retention_app = typer.Typer(
    help="Per-tenant retention, overriding CONDUCTOR_TRACE_RETENTION_DAYS.", no_args_is_help=True
)
traces_app.add_typer(retention_app, name="retention")


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
    mark: bool = typer.Option(
        True,
        "--mark/--no-mark",
        help="Record the workflows written as exported (default), so that `conductor traces "
        "prune` may delete those it kept for training; --no-mark: an export for another use.",
    ),
) -> None:
    """Write one training row per finished workflow: the Conductor prompt, its output, the
    reward (feedback) when known, the pool, the question, the reference answer when known, and
    the steps that ran (worker, who answered, cost) with the workflow's total cost. Once the
    file is complete, the workflows written are marked exported (their first export's time)."""
    from conductor_adapters.store.retention import mark_exported
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
    count = skipped = marked = 0
    written_ids: list[uuid.UUID] = []
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
                written_ids.append(uuid.UUID(row["workflow_id"]))
                count += 1
        os.replace(partial, target)  # readers never see half an export
        if mark:  # only once the file is whole: a failed export marks nothing
            marked = mark_exported(engine, written_ids)
    finally:
        partial.unlink(missing_ok=True)
        engine.dispose()
    typer.echo(f"exported {count} workflows from {redact_url(settings.database_url)} to {target}")
    if marked:
        typer.echo(f"marked {marked} workflows exported for the first time")
    if as_suite and not count:
        typer.echo("warning: no labelled workflows: the suite file is empty", err=True)
    if skipped:
        typer.echo(
            f"skipped {skipped} without a 'reference' label or with a 'kind' label other than "
            f"{' or '.join(SUITE_KINDS)}"
        )


# -- retention ------------------------------------------------------------------------------


@traces_app.command("prune")
def prune(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print what would be deleted, per tenant; delete nothing."
    ),
    export_to: str | None = typer.Option(
        None,
        "--export",
        metavar="FILE",
        help="First write each workflow to delete to this new JSON Lines file (the rows of "
        "`conductor traces export`); only what was written is deleted.",
    ),
    days: int | None = typer.Option(
        None,
        "--days",
        min=1,
        max=36_500,
        help="Keep workflows this many days, for this run (default: "
        "CONDUCTOR_TRACE_RETENTION_DAYS). Tenants with their own retention keep it.",
    ),
    batch_size: int = typer.Option(
        1000, "--batch-size", min=1, max=10_000, help="Workflows deleted per transaction."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as one JSON object."),
) -> None:
    """Delete the ended workflows past their retention (with their steps, attempts, events),
    oldest first, in short transactions that leave live writes alone. A workflow with feedback
    or a reference label is kept until `conductor traces export` has written it."""
    from conductor.errors import ConfigurationError
    from conductor_adapters.store import retention

    if dry_run and export_to is not None:
        raise ConfigurationError("--dry-run deletes nothing, so --export would write nothing")
    target = Path(export_to) if export_to is not None else None
    if target is not None:
        if target.exists():
            raise ConfigurationError(
                f"--export {target}: the file exists; name a new one (an export of deleted "
                "workflows is never overwritten)"
            )
        if not target.parent.is_dir():
            raise ConfigurationError(f"--export {target}: no directory {target.parent}")
    settings = get_settings()
    default_days = days if days is not None else settings.trace_retention_days
    check_schema(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        policy = retention.load_policy(engine, default_days)
        if policy.is_empty():
            raise ConfigurationError(
                "no retention policy: every workflow is kept forever. Set "
                "CONDUCTOR_TRACE_RETENTION_DAYS (or --days), or a tenant's own with "
                "`conductor traces retention set TENANT --days N`"
            )
        now = datetime.now(UTC)
        counts = retention.count(engine, policy, now)
        if dry_run:
            _print_counts(counts, as_json)
            return
        started = time.monotonic()
        if target is None:
            result = _prune_with_progress(engine, policy, now, batch_size, counts, None)
        else:
            variants = load_variants(settings)
            try:
                f = target.open("x", encoding="utf-8")
            except OSError as exc:
                raise ConfigurationError(f"--export {target}: {exc.strerror}") from None
            with f:
                writer = _PrunedRows(f, variants)
                try:
                    result = _prune_with_progress(engine, policy, now, batch_size, counts, writer)
                finally:
                    writer.drop_uncommitted()
        seconds = time.monotonic() - started
    finally:
        engine.dispose()
    kept = sum(c.kept_for_training for c in counts)
    if as_json:
        outcome = {
            "deleted_workflows": result.workflows,
            "deleted_steps": result.steps,
            "deleted_attempts": result.attempts,
            "batches": result.batches,
            "seconds": round(seconds, 3),
            "kept_for_training": kept,
            "exported_to": str(target) if target is not None else None,
            "scopes": retention.as_dict(counts),
        }
        typer.echo(json.dumps(outcome))
        return
    rate = result.workflows / seconds if seconds > 0 else 0.0
    typer.echo(
        f"deleted {result.workflows:,} workflows ({result.steps:,} steps, {result.attempts:,} "
        f"attempts) in {result.batches:,} batches, {seconds:.1f} s ({rate:,.0f} workflows/s), "
        f"from {redact_url(settings.database_url)}"
    )
    if kept:
        typer.echo(f"kept {kept:,} past retention for training until exported")
    if target is not None:
        typer.echo(f"wrote them first to {target}")


def _print_counts(counts: list[ScopeCount], as_json: bool) -> None:
    from conductor_adapters.store.retention import as_dict

    if as_json:
        typer.echo(json.dumps({"dry_run": True, "scopes": as_dict(counts)}))
        return
    for c in counts:
        if c.scope.cutoff is None:
            typer.echo(f"{c.scope.name}: kept forever")
            continue
        typer.echo(
            f"{c.scope.name}: keep {c.scope.days} days (created before "
            f"{c.scope.cutoff:%Y-%m-%d %H:%M} UTC): {c.past_retention:,} ended past retention, "
            f"{c.kept_for_training:,} kept for training until exported, "
            f"{c.to_delete:,} to delete"
        )
    total = sum(c.to_delete for c in counts)
    typer.echo(f"dry run: {total:,} workflows would be deleted; nothing was deleted")


def _prune_with_progress(
    engine: Engine,
    policy: RetentionPolicy,
    now: datetime,
    batch_size: int,
    counts: list[ScopeCount],
    writer: _PrunedRows | None,
) -> PruneResult:
    """The prune, with the progress bar (a line every 30 s where no terminal draws it)."""
    from sqlalchemy.exc import SQLAlchemyError

    from conductor_adapters.store.retention import prune as prune_traces
    from conductor_cli.progress import progress_bar, stderr_console

    console = stderr_console()
    total = sum(c.to_delete for c in counts)
    progress = progress_bar("prune", console, remaining=True)
    task = progress.add_task("deleting workflows", total=total)
    done = 0
    last_line = time.monotonic()

    def on_batch(deleted: int) -> None:
        nonlocal done, last_line
        done += deleted
        if writer is not None:
            writer.committed()
        progress.update(task, advance=deleted)
        if not console.is_terminal and time.monotonic() - last_line >= 30:
            last_line = time.monotonic()
            console.print(f"prune: {done:,}/{total:,} workflows deleted")

    try:
        with progress:
            return prune_traces(
                engine,
                policy,
                now,
                batch_size=batch_size,
                before_delete=writer.write if writer is not None else None,
                on_batch=on_batch,
            )
    except (OSError, SQLAlchemyError) as exc:
        # A lock held past the batch's lock timeout, the database gone, the export's disk full:
        # the batch in hand was rolled back; what the earlier ones deleted stays deleted.
        lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        reason = lines[0] if lines else type(exc).__name__
        written = f" (and is in {writer.f.name})" if writer is not None else ""
        typer.echo(
            f"conductor: error: the prune stopped after deleting {done:,} workflows: {reason}. "
            f"What was deleted stays deleted{written}; run it again for the rest.",
            err=True,
        )
        raise typer.Exit(1) from None


class _PrunedRows:
    """Writes each batch's workflows (the training export's rows) before they are deleted:
    flushed to disk before the batch's transaction commits, and cut off again if the batch
    did not commit, so the file holds exactly what was deleted."""

    def __init__(self, f: IO[str], variants: dict[str, Variant]) -> None:
        self.f = f
        self.variants = variants
        self.kept = 0  # the file's length up to the last committed batch

    def write(self, conn: Connection, ids: list[uuid.UUID]) -> None:
        from sqlmodel import Session, col, select

        from conductor_adapters.store.models import WorkflowRow
        from conductor_trainer.export import executed_steps, training_row, unplanned_row

        with Session(bind=conn) as session:
            rows = session.exec(
                select(WorkflowRow)
                .where(col(WorkflowRow.id).in_(ids))
                .order_by(col(WorkflowRow.created_at), col(WorkflowRow.id))
            ).all()
            steps = executed_steps(session, ids)
            for row in rows:
                ran = steps.get(row.id, [])
                exported = training_row(row, self.variants, ran) or unplanned_row(row, ran)
                self.f.write(json.dumps(exported, ensure_ascii=False) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def committed(self) -> None:
        self.kept = self.f.tell()

    def drop_uncommitted(self) -> None:
        self.f.flush()
        if self.f.tell() != self.kept:
            self.f.truncate(self.kept)


@retention_app.command("show")
def retention_show() -> None:
    """The deployment's retention, then each tenant's own: one JSON object per line (days
    null: kept forever)."""
    from conductor_adapters.store.retention import list_tenant_retention

    settings = get_settings()
    typer.echo(
        json.dumps(
            {
                "scope": "deployment",
                "days": settings.trace_retention_days,
                "setting": "CONDUCTOR_TRACE_RETENTION_DAYS",
            }
        )
    )
    engine = _engine()
    try:
        tenants = list_tenant_retention(engine)
    finally:
        engine.dispose()
    for t in tenants:
        typer.echo(json.dumps({"scope": "tenant", **t.model_dump(mode="json")}))


@retention_app.command("set")
def retention_set(
    tenant: str = typer.Argument(..., help="The tenant, as its API keys name it."),
    days: int | None = typer.Option(
        None, "--days", min=1, max=36_500, help="Keep its workflows this many days."
    ),
    forever: bool = typer.Option(False, "--forever", help="Keep its workflows forever."),
) -> None:
    """Give a tenant its own retention, overriding CONDUCTOR_TRACE_RETENTION_DAYS."""
    from conductor.errors import ConfigurationError
    from conductor_adapters.store.retention import set_tenant_retention

    if (days is None) == (not forever):
        raise ConfigurationError("give either --days N or --forever")
    engine = _engine()
    try:
        made = set_tenant_retention(engine, tenant, None if forever else days)
    finally:
        engine.dispose()
    typer.echo(json.dumps({"scope": "tenant", **made.model_dump(mode="json")}))


@retention_app.command("unset")
def retention_unset(tenant: str = typer.Argument(..., help="The tenant.")) -> None:
    """The tenant follows CONDUCTOR_TRACE_RETENTION_DAYS again."""
    from conductor.errors import InvalidRequest
    from conductor_adapters.store.retention import unset_tenant_retention

    engine = _engine()
    try:
        removed = unset_tenant_retention(engine, tenant)
    finally:
        engine.dispose()
    if not removed:
        raise InvalidRequest(f"tenant {tenant!r} has no retention of its own")
    typer.echo(f"tenant {tenant!r} follows the deployment's retention again")


def _engine() -> Engine:
    url = get_settings().database_url
    check_schema(url)
    return make_engine(url)
