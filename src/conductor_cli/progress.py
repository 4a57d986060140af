"""The progress bar every long command shows on stderr: what it is doing, the bar, done/total,
time elapsed (and, where the pace is steady, time remaining)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def progress_bar(label: str, console: Console, *, remaining: bool = False) -> Progress:
    """A bar whose task descriptions read after ``label``. Without a terminal (CI, a log file)
    rich draws nothing: commands print a line of their own where progress matters."""
    columns: list[ProgressColumn] = [
        TextColumn(f"[bold]{label}[/] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    if remaining:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)
