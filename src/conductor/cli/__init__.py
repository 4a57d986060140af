"""The ``conductor`` command. Each role of the system starts from here (CONVENTIONS 4)."""

from __future__ import annotations

import logging
import sys

import typer

from conductor.cli.aggregator import aggregator
from conductor.cli.ask import ask
from conductor.cli.db import db_app
from conductor.cli.eval import eval_command
from conductor.cli.gateway import gateway
from conductor.cli.keys import keys_app
from conductor.cli.planner import planner
from conductor.cli.pool import pool
from conductor.cli.serve import api, serve
from conductor.cli.stack import stack
from conductor.cli.traces import traces_app
from conductor.cli.train import train_command
from conductor.errors import ConductorError

app = typer.Typer(
    name="conductor",
    help="Orchestrate a pool of LLMs with a learned planner, the Conductor.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(ask)
app.command()(pool)
app.command()(gateway)
app.command()(planner)
app.command()(aggregator)
app.command()(stack)
app.command()(serve)
app.command()(api)
app.command(name="eval")(eval_command)
app.command(name="train")(train_command)
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(traces_app, name="traces")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="conductor: %(levelname)s: %(message)s")
    try:
        app()
    except ConductorError as exc:
        print(f"conductor: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
