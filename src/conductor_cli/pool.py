"""``conductor pool``: the workers the Conductor may call here, and why others cannot be."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from conductor_adapters.settings import get_settings, load_pool


def pool(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """List the worker pool (CONDUCTOR_POOL_FILE, or the default pool) with availability."""
    workers = load_pool(get_settings()).workers
    reasons = [w.availability() for w in workers]
    rows = [
        {
            "name": w.name,
            "provider": w.provider.value,
            "model": w.model,
            "available": reason is None,
            "reason": reason,
            "price_per_million": {"input": w.price.input, "output": w.price.output},
        }
        for w, reason in zip(workers, reasons, strict=True)
    ]
    if as_json:
        typer.echo(json.dumps({"workers": rows}, indent=2))
        return
    table = Table("name", "provider", "model", "$/M in", "$/M out", "status")
    for row, worker in zip(rows, workers, strict=True):
        status = "available" if row["available"] else f"unavailable: {row['reason']}"
        table.add_row(
            worker.name,
            worker.provider.value,
            worker.model,
            f"{worker.price.input:g}",
            f"{worker.price.output:g}",
            status,
        )
    Console().print(table)
