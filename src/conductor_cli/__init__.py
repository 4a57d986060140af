"""The ``conductor`` command: every role of the system starts from here, and a container runs the
same command with the role as its argument."""

from __future__ import annotations

import logging
import sys

import typer

from conductor.errors import ConductorError
from conductor_cli.aggregator import aggregator
from conductor_cli.ask import ask
from conductor_cli.db import db_app
from conductor_cli.eval import eval_command
from conductor_cli.gateway import gateway
from conductor_cli.keys import keys_app
from conductor_cli.outcomes import outcomes_app
from conductor_cli.planner import planner
from conductor_cli.pool import pool
from conductor_cli.router import router_app
from conductor_cli.serve import api, serve
from conductor_cli.stack import stack
from conductor_cli.traces import traces_app
from conductor_cli.train import train_command

app = typer.Typer(
    name="conductor",
    help="Orchestrate a pool of LLMs with a learned planner, the Conductor.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _trace_this_process(ctx: typer.Context) -> None:
    """Every command traces itself when the OTEL_* variables configure an exporter (before
    its servers and clients are made: the instrumentations patch them)."""
    from conductor_adapters.telemetry import configure_tracing

    configure_tracing(ctx.invoked_subcommand or "cli")


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
app.add_typer(outcomes_app, name="outcomes")
app.add_typer(router_app, name="router")
app.add_typer(traces_app, name="traces")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="conductor: %(levelname)s: %(message)s")
    try:
        app()
    except ConductorError as exc:
        print(f"conductor: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
