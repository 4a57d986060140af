"""``conductor outcomes``: recorded outcomes of real LLMs (RouterBench, RouterDC) as outcome
tables."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import typer
from rich.console import Console
from rich.table import Table

from conductor.errors import ConfigurationError

if TYPE_CHECKING:
    from conductor_evaluation import OutcomeRow, Source

outcomes_app = typer.Typer(
    help="Outcome tables: real LLMs' recorded answers to the same questions.",
    no_args_is_help=True,
)


@outcomes_app.command("import")
def import_command(
    files: list[str] = typer.Argument(  # noqa: B008 (typer's way to declare a list)
        ...,
        help="The files to import, combined into one table.",
        metavar="FILE",
        show_default=False,
    ),
    source: str = typer.Option(
        ...,
        "--from",
        help="routerbench (its CSV files), routerdc (its JSON files) or table (outcome tables: "
        "validated and merged).",
        show_default=False,
    ),
    out: str | None = typer.Option(
        None,
        "--out",
        "-o",
        help="The table to write (JSON Lines). Without it (--from table only) the tables are "
        "validated and summarised, nothing written.",
        metavar="TABLE.jsonl",
        show_default=False,
    ),
    split: str | None = typer.Option(
        None,
        "--split",
        help="train or test for every row, instead of the split each file's name gives "
        "(*_train, *-test, ...) or each table row has.",
        show_default=False,
    ),
    prices: str | None = typer.Option(
        None,
        "--prices",
        help="RouterDC only: a YAML or JSON file {model: {input: X, output: Y}} in USD per "
        "million tokens, over the built-in price table.",
        metavar="FILE",
        show_default=False,
    ),
) -> None:
    """Convert RouterBench or RouterDC files, or merge outcome tables, into one table.

    Prints what it holds: questions per domain and split, and per worker the questions with a
    recorded score, the mean score and the mean cost per 1,000 questions. A file that does not
    fit is refused (exit 2) naming the file, line and field, and nothing is written."""
    from conductor_evaluation import SOURCES, import_outcomes, read_prices, write_outcome_table

    if source not in SOURCES:
        raise ConfigurationError(f"--from {source!r}: choose one of {', '.join(SOURCES)}")
    if split not in (None, "train", "test"):
        raise ConfigurationError(f"--split {split!r}: choose train or test")
    if out is None and source != "table":
        raise ConfigurationError("--out is needed: only --from table may validate without one")
    if prices is not None and source != "routerdc":
        raise ConfigurationError(
            "--prices applies to --from routerdc only (the others record cost)"
        )
    imported = import_outcomes(
        cast("Source", source),
        [Path(f) for f in files],
        split=cast('Literal["train", "test"] | None', split),
        prices=read_prices(Path(prices)) if prices else None,
    )
    console = Console(highlight=False)
    for note in imported.notes:
        console.print(f"note: {note}")
    console.print(_split_table(imported.rows))
    console.print(_worker_table(imported.rows))
    if out is None:
        console.print(f"{len(imported.rows)} rows valid; nothing written (no --out)")
        return
    count = write_outcome_table(imported.rows, Path(out))
    console.print(f"{count} rows written to {out}")


def _split_table(rows: list[OutcomeRow]) -> Table:
    """Questions per domain and split, with the totals."""
    splits = ("train", "test", None)
    table = Table(title=f"{len(rows)} questions")
    for column in ("domain", "questions", "train", "test", "no split"):
        table.add_column(column, justify="left" if column == "domain" else "right", overflow="fold")
    domains = list(dict.fromkeys(row.domain for row in rows))
    for domain in [*domains, None]:
        chosen = [row for row in rows if domain is None or row.domain == domain]
        counts = [sum(row.split == split for row in chosen) for split in splits]
        table.add_row(domain or "all", str(len(chosen)), *(str(count) for count in counts))
    return table


def _worker_table(rows: list[OutcomeRow]) -> Table:
    """Per worker: questions with a recorded score, the mean score on them, and the mean cost
    of a recorded answer, per 1,000 questions."""
    table = Table(title="workers")
    for column in ("worker", "questions recorded", "mean score", "cost per 1k questions (USD)"):
        table.add_column(column, justify="left" if column == "worker" else "right", overflow="fold")
    workers = list(dict.fromkeys(worker for row in rows for worker in row.outcomes))
    for worker in workers:
        outcomes = [row.outcomes[worker] for row in rows if worker in row.outcomes]
        scores = [o.score for o in outcomes if o.score is not None]
        costs = [o.cost_usd for o in outcomes if o.cost_usd is not None]
        table.add_row(
            worker,
            str(len(scores)),
            f"{sum(scores) / len(scores):.3f}" if scores else "-",
            f"{sum(costs) / len(costs) * 1000:.3f}" if costs else "-",
        )
    return table
