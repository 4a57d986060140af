"""``conductor ask``: one workflow in this process, shown as it runs."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conductor.errors import ConductorError
from conductor.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE, Profile, get_profile
from conductor.settings import Settings, get_settings
from conductor.traces.db import redact_url
from conductor.workflow import (
    PlanOutcome,
    StepKind,
    StepRecord,
    StepStatus,
    WorkflowResult,
    WorkflowStatus,
)

if TYPE_CHECKING:  # imported lazily at run time: loading it pulls in the model engine
    from conductor_aggregator.embedded import EmbeddedRuntime

SHORT_OUTPUT_CHARS = 160


def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    variant: str = typer.Option(
        DEFAULT_PROFILE,
        "--variant",
        "-v",
        help=f"Orchestration profile: {', '.join(BUILTIN_PROFILES)}.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object, nothing else."),
    distributed: bool = typer.Option(
        False,
        "--distributed",
        "-d",
        help="Submit to the distributed stack (`conductor stack`) and wait for the answer.",
    ),
) -> None:
    """Answer QUESTION with a workflow the Conductor writes, and keep its trace."""
    from conductor.orchestration import check_question

    check_question(question)
    settings = get_settings()
    profile = get_profile(variant)
    console = Console(highlight=False, soft_wrap=False)
    if distributed:
        from conductor.stack import local_stack_env

        database_url = local_stack_env()["CONDUCTOR_DATABASE_URL"]
        result = _run_distributed(question, profile, database_url)
    else:
        database_url = settings.database_url
        observers = [] if as_json else [ConsoleObserver(console)]
        result = asyncio.run(_run(question, profile, settings, observers))
    trace = redact_url(database_url)
    if as_json:
        from conductor_aggregator.executor import workflow_summary

        typer.echo(json.dumps({**workflow_summary(result), "trace": trace}, ensure_ascii=False))
    else:
        _print_summary(console, result, trace)
    if result.status is not WorkflowStatus.COMPLETED:
        raise typer.Exit(1)


async def _run(
    question: str, profile: Profile, settings: Settings, observers: list[Any]
) -> WorkflowResult:
    from conductor_aggregator.embedded import open_embedded_runtime

    runtime = await open_embedded_runtime(settings, observers)
    try:
        if observers:
            observers[0].show_pool(runtime)
        return await runtime.executor.run(question, profile)
    finally:
        await runtime.aclose()


def _short(text: str | None) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= SHORT_OUTPUT_CHARS else flat[: SHORT_OUTPUT_CHARS - 1] + "…"


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.1f} s"


class ConsoleObserver:
    """Prints the plan when it is written and each step as it finishes."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def show_pool(self, runtime: EmbeddedRuntime) -> None:
        names = ", ".join(entry.name for entry in runtime.executor.entries)
        self.console.print(f"[bold]Pool[/]: {escape(names)}")
        for spec, reason in runtime.unavailable:
            self.console.print(f"  [dim]unavailable: {escape(spec.name)} ({escape(reason)})[/]")

    async def workflow_started(self, result: WorkflowResult, pool_snapshot: Any) -> None:
        self.console.print(f"[bold]Workflow[/] {result.workflow_id} ({result.variant})")

    async def plan_ready(self, result: WorkflowResult, outcome: PlanOutcome) -> None:
        state = "valid" if outcome.valid else "[red]invalid[/]"
        if outcome.stop and outcome.valid:
            state = "stop: the Conductor keeps the last answer"
        self.console.print(
            f"\n[bold]Plan[/] round {outcome.round} ({state}; "
            f"{outcome.usage.total_tokens} tokens, {_seconds(outcome.latency_ms)}, "
            f"{outcome.backend})"
        )
        for error in outcome.errors:
            self.console.print(f"  [red]{escape(error)}[/]")
        if not outcome.valid and not outcome.stop:
            self.console.print("  [yellow]using the fallback plan[/]")
        if outcome.plan.steps:
            table = Table("step", "worker", "access", "subtask", box=None, pad_edge=False)
            offset = len(result.steps)
            for i, step in enumerate(outcome.plan.steps):
                table.add_row(
                    str(offset + i),
                    escape(outcome.worker_of(step).name),
                    escape(json.dumps(list(step.access_list))),
                    escape(step.subtask),
                )
            self.console.print(table)
        self.console.print()

    async def step_started(self, result: WorkflowResult, step: StepRecord) -> None:
        return None

    async def step_finished(self, result: WorkflowResult, step: StepRecord) -> None:
        head = f"[bold]Step {step.index}[/] {escape(step.worker)}"
        if step.kind is StepKind.CONDUCTOR:
            self.console.print(f"{head} {escape(step.output or step.error or '')}")
            return
        if step.status is StepStatus.SUCCEEDED:
            usage = step.usage
            self.console.print(
                f"{head} [dim]{usage.prompt_tokens}+{usage.completion_tokens} tokens, "
                f"{_seconds(step.latency_ms)}[/]\n  {escape(_short(step.output))}"
            )
        else:
            self.console.print(f"{head} [red]{step.status.value}[/] {escape(step.error or '')}")

    async def workflow_finished(self, result: WorkflowResult) -> None:
        return None


def _run_distributed(question: str, profile: Profile, database_url: str) -> WorkflowResult:
    """Submit through the broker, then follow the workflow's run row until it finishes."""
    import time

    from conductor.messaging import new_celery_app
    from conductor.runs import SubmitRequest, load_run, submit_workflow
    from conductor.settings import BrokerSettings
    from conductor.stack import local_stack_env
    from conductor.traces.db import check_schema, make_engine

    env = local_stack_env()
    broker = BrokerSettings(
        broker_url=env["CONDUCTOR_BROKER_URL"], redis_url=env["CONDUCTOR_REDIS_URL"]
    )
    check_schema(database_url)
    app = new_celery_app("conductor_client", broker)
    engine = make_engine(database_url)
    try:
        request = SubmitRequest(question=question, profile=profile)
        workflow_id = submit_workflow(engine, app, request)
        deadline = time.monotonic() + profile.workflow_timeout_s + 60
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                run = load_run(conn, workflow_id)
            if run is not None and run.state is not None and run.state.finished:
                return run.state.result
            time.sleep(0.2)
    finally:
        engine.dispose()
    raise ConductorError(
        f"workflow {workflow_id} did not finish in time; is `conductor stack` running?"
    )


def _print_summary(console: Console, result: WorkflowResult, trace: str) -> None:
    if result.status is WorkflowStatus.COMPLETED:
        console.print(f"\n[bold]Answer[/]\n{escape(result.answer or '')}")
    else:
        console.print(f"\n[bold red]Failed[/]: {escape(result.error or 'unknown error')}")
    usage = result.usage
    console.print(
        f"\n[dim]{usage.total_tokens} tokens ({usage.prompt_tokens} prompt + "
        f"{usage.completion_tokens} completion, Conductor included), ${result.cost_usd:.6f}, "
        f"{_seconds(result.latency_ms)}; trace {result.workflow_id} in {escape(trace)}[/]"
    )
