"""``conductor ask``: one workflow in this process, shown as it runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conductor.errors import ConductorError
from conductor.machine import EventKind, MachineEvent, event_subject
from conductor.variants import BUILTIN_VARIANTS, DEFAULT_VARIANT, Variant, get_variant
from conductor.workflow import (
    PlanOutcome,
    StepKind,
    StepRecord,
    StepStatus,
    WorkflowRecord,
    WorkflowStatus,
)
from conductor_adapters.settings import Settings, get_settings
from conductor_adapters.store.db import redact_url
from conductor_cli.timings import Timings, process_age_ms

if TYPE_CHECKING:  # imported lazily at run time: loading it pulls in the model engine
    from conductor_cli.wiring import EmbeddedRuntime

SHORT_OUTPUT_CHARS = 160


def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    variant: str = typer.Option(
        DEFAULT_VARIANT,
        "--variant",
        "-v",
        help=f"Orchestration variant: {', '.join(BUILTIN_VARIANTS)}.",
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

    startup_ms = process_age_ms()  # the interpreter and the command's imports
    check_question(question)
    settings = get_settings()
    chosen = get_variant(variant)
    console = Console(highlight=False, soft_wrap=False)
    timings = Timings()
    if distributed:
        from conductor_cli.local_stack import local_stack_env

        env = local_stack_env()
        database_url = env["CONDUCTOR_DATABASE_URL"]
        with timings.phase("workflow"):
            result = _run_distributed(question, chosen, env)
    else:
        database_url = settings.database_url
        observers = [] if as_json else [ConsoleObserver(console)]
        result = asyncio.run(_run(question, chosen, settings, observers, timings))
    trace = redact_url(database_url)
    if as_json:
        breakdown = {"startup_ms": startup_ms, **{f"{k}_ms": v for k, v in timings.ms.items()}}
        breakdown["total_ms"] = process_age_ms()
        summary = {**workflow_summary(result), "trace": trace, "timings": breakdown}
        typer.echo(json.dumps(summary, ensure_ascii=False))
    else:
        _print_summary(console, result, trace)
    if result.status is not WorkflowStatus.COMPLETED:
        raise typer.Exit(1)


async def _run(
    question: str,
    variant: Variant,
    settings: Settings,
    observers: list[Any],
    timings: Timings,
) -> WorkflowRecord:
    with timings.phase("runtime_imports"):  # the model engine, the gateway, the trace store
        from conductor_cli.wiring import open_embedded_runtime

    runtime = await open_embedded_runtime(settings, observers, timings)
    try:
        if observers:
            observers[0].show_pool(runtime)
        with timings.phase("workflow"):
            return await runtime.executor.run(question, variant)
    finally:
        with timings.phase("close"):
            await runtime.aclose()


def _short(text: str | None) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= SHORT_OUTPUT_CHARS else flat[: SHORT_OUTPUT_CHARS - 1] + "…"


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.1f} s"


class ConsoleObserver:
    """Prints the plan when it is written and each step as it finishes (a WorkflowObserver)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def show_pool(self, runtime: EmbeddedRuntime) -> None:
        names = ", ".join(entry.name for entry in runtime.executor.entries)
        self.console.print(f"[bold]Pool[/]: {escape(names)}")
        for spec, reason in runtime.unavailable:
            self.console.print(f"  [dim]unavailable: {escape(spec.name)} ({escape(reason)})[/]")

    async def observe(self, workflow: WorkflowRecord, events: Sequence[MachineEvent]) -> None:
        for event in events:
            if event.kind is EventKind.STARTED:
                self.console.print(f"[bold]Workflow[/] {workflow.workflow_id} ({workflow.variant})")
                continue
            subject = event_subject(workflow, event)
            if isinstance(subject, PlanOutcome):
                self._plan(workflow, subject)
            elif isinstance(subject, StepRecord) and event.kind is EventKind.STEP_FINISHED:
                self._step(subject)

    def _plan(self, result: WorkflowRecord, outcome: PlanOutcome) -> None:
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
            # Steps are numbered across rounds: this round's first step's global index.
            offset = next((s.index for s in result.steps if s.round == outcome.round), 0)
            for i, step in enumerate(outcome.plan.steps):
                table.add_row(
                    str(offset + i),
                    escape(outcome.worker_of(step).name),
                    escape(json.dumps(list(step.access_list))),
                    escape(step.subtask),
                )
            self.console.print(table)
        self.console.print()

    def _step(self, step: StepRecord) -> None:
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


def _run_distributed(question: str, variant: Variant, env: dict[str, str]) -> WorkflowRecord:
    """Submit through the broker of the local stack's ``env``, then follow the workflow's run
    row until it finishes."""
    import time

    from conductor_adapters.queue import new_celery_app
    from conductor_adapters.settings import BrokerSettings
    from conductor_adapters.store.db import check_schema, make_engine
    from conductor_adapters.store.runs import SubmitRequest, load_run, submit_workflow

    database_url = env["CONDUCTOR_DATABASE_URL"]
    broker = BrokerSettings(
        broker_url=env["CONDUCTOR_BROKER_URL"], redis_url=env["CONDUCTOR_REDIS_URL"]
    )
    check_schema(database_url)
    app = new_celery_app("conductor_client", broker)
    engine = make_engine(database_url)
    try:
        request = SubmitRequest(question=question, variant=variant)
        workflow_id = submit_workflow(engine, app, request)
        deadline = time.monotonic() + variant.workflow_timeout_s + 60
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


def _print_summary(console: Console, result: WorkflowRecord, trace: str) -> None:
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


def workflow_summary(result: WorkflowRecord) -> dict[str, Any]:
    """The machine-readable summary ``conductor ask --json`` prints."""
    return {
        "workflow_id": str(result.workflow_id),
        "variant": result.variant,
        "status": result.status.value,
        "plan_valid": result.plan_valid,
        "plan": [
            {
                "index": s.index,
                "round": s.round,
                "worker": s.worker,
                "subtask": s.subtask,
                "access_list": s.access_list,
            }
            for s in result.steps
        ],
        "planner_calls": [
            {
                "round": c.round,
                "valid": c.valid,
                "errors": c.errors,
                "stop": c.stop,
                "backend": c.backend,
                "raw_output": c.raw_output,
                "usage": c.usage.as_dict(),
                "latency_ms": round(c.latency_ms, 1),
            }
            for c in result.planner_calls
        ],
        "steps": [
            {
                "index": s.index,
                "worker": s.worker,
                "status": s.status.value,
                "output": s.output,
                "error": s.error,
                "usage": s.usage.as_dict(),
                "cost_usd": s.cost_usd,
                "latency_ms": round(s.latency_ms, 1),
                "attempts": [
                    {
                        "number": a.number,
                        "worker": a.worker,
                        "status": a.status,
                        "error_class": a.error_class,
                        "status_code": a.status_code,
                        "cost_usd": a.cost_usd,
                        "latency_ms": round(a.latency_ms, 1),
                        "quota_wait_ms": round(a.quota_wait_ms, 1),
                    }
                    for a in s.attempts
                ],
            }
            for s in result.steps
        ],
        "answer": result.answer,
        "error": result.error,
        "usage": result.usage.as_dict(),
        "cost_usd": result.cost_usd,
        "latency_ms": round(result.latency_ms, 1),
    }
