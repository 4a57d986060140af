"""`conductor traces prune` on 100,000 workflows in PostgreSQL while new workflows keep coming.

Fills a database of its own (migrated as `conductor db upgrade` does) with --workflows
workflows, bulk-loaded with COPY: created over the last --spread-days days, each with 1 to 5
steps (one or two provider attempts each: a retry now and then) and its events (started,
plan, a start and an end per step, the outcome), texts of the sizes real traces have; 2% carry
client feedback (training data, kept past retention until exported), one tenant in five keeps
its workflows --tenant-days days instead of --retention-days.

Then --writers threads write new workflows as the trace store does, each in three
transactions (the workflow with its first event; its steps, attempts and events; its outcome),
together at --rate workflows a second, timing each transaction; a sampler reads
pg_stat_activity every 20 ms: statements waiting on a lock (any backend), and what the
writers' statements wait on (locks, WAL, I/O), for how long. After --warmup seconds the
command runs as an operator runs it (`conductor traces prune --json`, a process of its own);
the writers go on for --cooldown seconds after it ends. Prints the prune's time and rates, the
writers' transaction latency (p50, p99, max, how many took 250 ms and 1 s or more) before,
during and after the prune, the longest lock wait seen and the writers' longest waits by
event; the done-when of issue 38 is that no write waits 1 s or more on a lock (PASS/FAIL).

    python benchmarks/trace_prune.py [--workflows 100000] [--writers 2] [--rate 40]
        [--batch-size 1000] [--server postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
        [--keep] [--json out.json]

The database (conductor_bench_prune_<random>) is dropped afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url

from conductor_adapters.store.db import make_engine, normalize_url, upgrade

DEFAULT_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
TENANTS = ["default", "acme", "globex", "initech", "umbrella"]
LONG_TENANT = "acme"  # keeps --tenant-days
QUESTION = "Compare the two offers below and say which costs less over three years. " * 3
SUBTASK = "Compute the three-year cost of the first offer, monthly fee and set-up included."
OUTPUT = "The first offer costs 36 x 42.50 + 99 = 1,629.00 over three years. " * 6
PLANNER_CALL = {
    "round": 0,
    "raw_output": "model_id = [0, 1, 2]\nsubtasks = ['...', '...', '...']\n"
    "access_list = [[], [], [0, 1]]",
    "valid": True,
    "errors": [],
    "plan": {"steps": [{"model_id": 0, "subtask": SUBTASK, "access_list": []}]},
    "pool": [{"name": "gpt", "description": ""}, {"name": "claude", "description": ""}],
    "usage": {"prompt_tokens": 940, "completion_tokens": 90},
    "backend": "openai",
}
POOL_SNAPSHOT = [{"name": "gpt", "provider": "openai", "model": "gpt-4o-mini"}]

WORKFLOW_COLUMNS = [
    "id",
    "tenant",
    "variant",
    "question",
    "status",
    "pool_snapshot",
    "planner_calls",
    "plan",
    "plan_valid",
    "answer",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "total_tokens",
    "cost_usd",
    "latency_ms",
    "feedback",
    "labels",
    "created_at",
    "finished_at",
]
STEP_COLUMNS = [
    "id",
    "workflow_id",
    "index",
    "round",
    "kind",
    "worker",
    "subtask",
    "access_list",
    "visible_steps",
    "status",
    "output",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "total_tokens",
    "cost_usd",
    "latency_ms",
    "started_at",
    "finished_at",
]
ATTEMPT_COLUMNS = [
    "id",
    "step_id",
    "number",
    "worker",
    "status",
    "error_class",
    "error",
    "status_code",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost_usd",
    "latency_ms",
    "quota_wait_ms",
    "started_at",
]
EVENT_COLUMNS = ["workflow_id", "sequence", "kind", "at", "payload"]


def _json(value: Any) -> str:
    return json.dumps(value)


def workflow_rows(
    workflow_id: uuid.UUID, tenant: str, created: datetime, feedback: float | None, steps: int
) -> tuple[list[Any], list[list[Any]], list[list[Any]], list[list[Any]]]:
    """One finished workflow's rows: workflow, steps, attempts, events."""
    finished = created + timedelta(seconds=8)
    workflow = [
        workflow_id,
        tenant,
        "conductor-ultra",
        QUESTION,
        "completed",
        _json(POOL_SNAPSHOT),
        _json([PLANNER_CALL]),
        _json([{"round": 0, "model_id": 0, "worker": "gpt", "subtask": SUBTASK}] * steps),
        True,
        OUTPUT,
        3000,
        600,
        0,
        0,
        3600,
        0.0042,
        8000.0,
        feedback,
        _json({"request_id": workflow_id.hex[:12]}),
        created,
        finished,
    ]
    step_rows, attempt_rows = [], []
    events = [[workflow_id, 1, "started", created, _json({"workers": ["gpt"]})]]
    events.append([workflow_id, 2, "plan", created, _json({"round": 0})])
    for index in range(steps):
        step_id = uuid.uuid4()
        at = created + timedelta(seconds=1 + index)
        step_rows.append(
            [
                step_id,
                workflow_id,
                index,
                0,
                "worker",
                "gpt",
                SUBTASK,
                _json([]),
                _json(list(range(index))),
                "succeeded",
                OUTPUT,
                600,
                120,
                0,
                0,
                720,
                0.0008,
                1500.0,
                at,
                at + timedelta(seconds=1),
            ]
        )
        tries = 2 if random.random() < 0.2 else 1
        for number in range(1, tries + 1):
            ok = number == tries
            attempt_rows.append(
                [
                    uuid.uuid4(),
                    step_id,
                    number,
                    "gpt",
                    "ok" if ok else "error",
                    None if ok else "RateLimited",
                    None if ok else "429 Too Many Requests",
                    200 if ok else 429,
                    600 if ok else 0,
                    120 if ok else 0,
                    0,
                    0,
                    0.0008 if ok else 0.0,
                    700.0,
                    0.0,
                    at,
                ]
            )
        events.append([workflow_id, 3 + 2 * index, "step_started", at, _json({"step": index})])
        events.append([workflow_id, 4 + 2 * index, "step_finished", at, _json({"step": index})])
    events.append([workflow_id, 3 + 2 * steps, "completed", finished, _json({})])
    return workflow, step_rows, attempt_rows, events


def fill(dsn: str, args: argparse.Namespace, now: datetime) -> dict[str, int]:
    """COPY the workflows in, in chunks; returns the rows per table."""
    rng = random.Random(args.seed)
    random.seed(args.seed)
    counts = {"workflow": 0, "step": 0, "attempt": 0, "workflow_event": 0}
    chunk = 5000
    with psycopg.connect(dsn) as conn:
        for start in range(0, args.workflows, chunk):
            tables: dict[str, list[list[Any]]] = {name: [] for name in counts}
            for _ in range(start, min(start + chunk, args.workflows)):
                created = now - timedelta(seconds=rng.uniform(0, args.spread_days * 86400))
                feedback = rng.choice([0.0, 1.0]) if rng.random() < 0.02 else None
                workflow, steps, attempts, events = workflow_rows(
                    uuid.uuid4(), rng.choice(TENANTS), created, feedback, rng.randint(1, 5)
                )
                tables["workflow"].append(workflow)
                tables["step"] += steps
                tables["attempt"] += attempts
                tables["workflow_event"] += events
            with conn.cursor() as cur:
                for name, columns in (
                    ("workflow", WORKFLOW_COLUMNS),
                    ("step", STEP_COLUMNS),
                    ("attempt", ATTEMPT_COLUMNS),
                    ("workflow_event", EVENT_COLUMNS),
                ):
                    quoted = ", ".join(f'"{c}"' for c in columns)
                    with cur.copy(f"COPY {name} ({quoted}) FROM STDIN") as copy:
                        for row in tables[name]:
                            copy.write_row(row)
                    counts[name] += len(tables[name])
            conn.commit()
        conn.execute("ANALYZE")
    return counts


@dataclass
class Writes:
    """Each writer transaction: when it started (monotonic) and how long it took."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    workflows: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def writer(dsn: str, rate: float, stop: threading.Event, writes: Writes, seed: int) -> None:
    """New workflows as the trace store writes them: three transactions each, at ``rate``."""
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=False, application_name=WRITER_APP) as conn:
        next_at = time.monotonic()
        while not stop.is_set():
            next_at += rng.expovariate(rate)
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            workflow_id = uuid.uuid4()
            now = datetime.now(UTC)
            workflow, steps, attempts, events = workflow_rows(
                workflow_id, rng.choice(TENANTS), now, None, rng.randint(1, 5)
            )
            workflow[4] = "running"
            try:
                with conn.cursor() as cur:
                    started = time.monotonic()
                    cur.execute(_insert("workflow", WORKFLOW_COLUMNS), workflow)
                    cur.execute(_insert("workflow_event", EVENT_COLUMNS), events[0])
                    conn.commit()
                    middle = time.monotonic()
                    cur.executemany(_insert("step", STEP_COLUMNS), steps)
                    cur.executemany(_insert("attempt", ATTEMPT_COLUMNS), attempts)
                    cur.executemany(_insert("workflow_event", EVENT_COLUMNS), events[1:-1])
                    conn.commit()
                    last = time.monotonic()
                    cur.execute(
                        "UPDATE workflow SET status = 'completed', finished_at = now() "
                        "WHERE id = %s",
                        (workflow_id,),
                    )
                    cur.execute(_insert("workflow_event", EVENT_COLUMNS), events[-1])
                    conn.commit()
                    done = time.monotonic()
            except psycopg.Error as exc:
                conn.rollback()
                with writes.lock:
                    writes.errors.append(str(exc).strip())
                continue
            with writes.lock:
                writes.samples += [
                    (started, middle - started),
                    (middle, last - middle),
                    (last, done - last),
                ]
                writes.workflows += 1
                writes.rows += 1 + len(steps) + len(attempts) + len(events)


def _insert(table: str, columns: list[str]) -> str:
    names = ", ".join(f'"{c}"' for c in columns)
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join(['%s'] * len(columns))})"


WRITER_APP = "bench-writer"


@dataclass
class Waits:
    """What pg_stat_activity showed every 20 ms: the longest a statement of any backend
    waited on a lock (its statement's age: an upper bound), and, per wait event, the longest
    run of samples in which one writer statement waited on it (locks, I/O, WAL, ...)."""

    lock_longest_s: float = 0.0
    lock_longest_query: str = ""
    writer_longest: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    lock_samples: int = 0


def wait_sampler(dsn: str, stop: threading.Event, waits: Waits) -> None:
    first_seen: dict[tuple[Any, ...], float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(
                "SELECT pid, application_name, wait_event_type, wait_event, query_start, "
                "extract(epoch FROM clock_timestamp() - query_start), left(query, 80) "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'active' AND wait_event IS NOT NULL "
                "AND wait_event_type NOT IN ('Activity', 'Client') AND pid <> pg_backend_pid()"
            ).fetchall()
            now = time.monotonic()
            waits.samples += 1
            seen = set()
            for pid, app, kind, event, query_start, age, query in rows:
                if kind == "Lock":
                    waits.lock_samples += 1
                    if float(age) > waits.lock_longest_s:
                        waits.lock_longest_s, waits.lock_longest_query = float(age), query
                if app != WRITER_APP:
                    continue
                key = (pid, kind, event, query_start)
                seen.add(key)
                began = first_seen.setdefault(key, now)
                label = f"{kind}:{event}"
                waits.writer_longest[label] = max(
                    waits.writer_longest.get(label, 0.0), now - began + 0.02
                )
            first_seen = {k: v for k, v in first_seen.items() if k in seen}
            time.sleep(0.02)


def latency(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
        "over_250ms": sum(1 for x in ordered if x >= 0.25),
        "over_1s": sum(1 for x in ordered if x >= 1.0),
    }


def table_rows(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {
            name: int(conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0])  # type: ignore[index]
            for name in ("workflow", "step", "attempt", "workflow_event")
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--spread-days", type=float, default=120)
    parser.add_argument("--retention-days", type=int, default=30)
    parser.add_argument("--tenant-days", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=40.0, help="new workflows a second, all")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--cooldown", type=float, default=3.0)
    parser.add_argument("--server", default=os.environ.get("CONDUCTOR_BENCH_POSTGRES_URL"))
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", dest="json_out", help="also write the figures here")
    args = parser.parse_args()

    server = normalize_url(args.server or DEFAULT_SERVER)
    name = f"conductor_bench_prune_{uuid.uuid4().hex[:10]}"
    admin = make_engine(server).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name)
    sqlalchemy_url = url.render_as_string(hide_password=False)
    dsn = make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(False)
    try:
        run(args, sqlalchemy_url, dsn)
    finally:
        if not args.keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        else:
            print(f"kept the database {name}")
        admin.dispose()


def run(args: argparse.Namespace, url: str, dsn: str) -> None:
    upgrade(url)
    now = datetime.now(UTC)
    started = time.monotonic()
    loaded = fill(dsn, args, now)
    fill_s = time.monotonic() - started
    print(
        f"filled {loaded['workflow']:,} workflows ({loaded['step']:,} steps, "
        f"{loaded['attempt']:,} attempts, {loaded['workflow_event']:,} events) in {fill_s:.1f} s"
    )
    env = {
        **os.environ,
        "CONDUCTOR_DATABASE_URL": url,
        "CONDUCTOR_TRACE_RETENTION_DAYS": str(args.retention_days),
    }
    cli = [sys.executable, "-c", "from conductor_cli import main; main()"]
    subprocess.run(
        [*cli, "traces", "retention", "set", LONG_TENANT, "--days", str(args.tenant_days)],
        env=env,
        check=True,
        capture_output=True,
    )
    dry = subprocess.run(
        [*cli, "traces", "prune", "--dry-run", "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    planned = json.loads(dry.stdout)["scopes"]
    to_delete = sum(s["to_delete"] for s in planned)
    print(f"dry run: {to_delete:,} to delete; " + "; ".join(_scope(s) for s in planned))

    before = table_rows(dsn)
    stop_writers, stop_sampler = threading.Event(), threading.Event()
    writes, waits = Writes(), Waits()
    threads = [
        threading.Thread(
            target=writer, args=(dsn, args.rate / args.writers, stop_writers, writes, i)
        )
        for i in range(args.writers)
    ]
    sampler = threading.Thread(target=wait_sampler, args=(dsn, stop_sampler, waits))
    for thread in [*threads, sampler]:
        thread.start()
    time.sleep(args.warmup)
    prune_started = time.monotonic()
    done = subprocess.run(
        [*cli, "traces", "prune", "--json", "--batch-size", str(args.batch_size)],
        env=env,
        capture_output=True,
        text=True,
    )
    prune_ended = time.monotonic()
    time.sleep(args.cooldown)
    stop_writers.set()
    for thread in threads:
        thread.join()
    stop_sampler.set()
    sampler.join()
    if done.returncode != 0:
        raise SystemExit(f"the prune failed ({done.returncode}): {done.stderr[-2000:]}")
    outcome = json.loads(done.stdout)
    after = table_rows(dsn)
    rows_deleted = sum(before.values()) + writes.rows - sum(after.values())
    left = subprocess.run(
        [*cli, "traces", "prune", "--dry-run", "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    left_to_delete = sum(s["to_delete"] for s in json.loads(left.stdout)["scopes"])

    wall = prune_ended - prune_started
    seconds = outcome["seconds"]
    phases = {
        "before": [d for t, d in writes.samples if t < prune_started],
        "during": [d for t, d in writes.samples if prune_started <= t < prune_ended],
        "after": [d for t, d in writes.samples if t >= prune_ended],
    }
    figures = {
        "workflows_loaded": loaded["workflow"],
        "rows_loaded": sum(loaded.values()),
        "fill_s": round(fill_s, 1),
        "deleted_workflows": outcome["deleted_workflows"],
        "deleted_rows": rows_deleted,
        "kept_for_training": outcome["kept_for_training"],
        "left_to_delete_after": left_to_delete,
        "batches": outcome["batches"],
        "prune_delete_s": seconds,
        "prune_command_wall_s": round(wall, 2),
        "workflows_per_s": round(outcome["deleted_workflows"] / seconds),
        "rows_per_s": round(rows_deleted / seconds),
        "writer_workflows": writes.workflows,
        "writer_errors": len(writes.errors),
        "writer_transactions": {k: latency(v) for k, v in phases.items()},
        "longest_lock_wait_s": round(waits.lock_longest_s, 3),
        "longest_lock_wait_query": waits.lock_longest_query,
        "lock_wait_samples": f"{waits.lock_samples} waiting backends in {waits.samples} samples",
        "writer_longest_wait_ms": {
            k: round(v * 1000) for k, v in sorted(waits.writer_longest.items(), key=lambda x: -x[1])
        },
    }
    print(
        f"prune: deleted {figures['deleted_workflows']:,} workflows, {rows_deleted:,} rows "
        f"(steps, attempts, events with them) in {outcome['batches']} batches of "
        f"{args.batch_size}: {seconds:.1f} s deleting ({figures['workflows_per_s']:,} "
        f"workflows/s, {figures['rows_per_s']:,} rows/s); the command took {wall:.1f} s "
        f"(start and the count included); kept for training {outcome['kept_for_training']:,}; "
        f"left past retention after it: {left_to_delete}"
    )
    print(
        f"writers: {writes.workflows:,} new workflows ({len(writes.samples):,} transactions, "
        f"{len(writes.errors)} failed) at {args.rate:g}/s from {args.writers} connections"
    )
    for phase, stats in figures["writer_transactions"].items():
        if stats["n"]:
            print(
                f"  {phase:6} the prune: {stats['n']:5,} transactions, p50 {stats['p50_ms']} ms, "
                f"p99 {stats['p99_ms']} ms, max {stats['max_ms']} ms; "
                f"{stats['over_250ms']} took 250 ms or more, {stats['over_1s']} 1 s or more"
            )
    print(
        "longest lock wait of any statement (pg_stat_activity every 20 ms): "
        f"{waits.lock_longest_s * 1000:.0f} ms"
        + (f" ({waits.lock_longest_query!r})" if waits.lock_longest_query else "")
        + f"; {figures['lock_wait_samples']}"
    )
    longest = list(figures["writer_longest_wait_ms"].items())[:4]
    print(
        "writers' longest waits by event: "
        + (", ".join(f"{event} {ms} ms" for event, ms in longest) or "none seen")
    )
    slowest = max(s.get("max_ms", 0) for s in figures["writer_transactions"].values()) / 1000
    verdict = "PASS" if waits.lock_longest_s < 1.0 and not writes.errors else "FAIL"
    print(
        f"{verdict}: no write of the load waited 1 s or more on a lock (longest lock wait "
        f"{waits.lock_longest_s * 1000:.0f} ms; the slowest writer transaction, everything "
        f"included, took {slowest * 1000:.0f} ms)"
    )
    if writes.errors:
        print(f"writer errors: {writes.errors[:3]}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)


def _scope(scope: dict[str, Any]) -> str:
    if scope["retention_days"] is None:
        return f"{scope['scope']}: forever"
    return (
        f"{scope['scope']} ({scope['retention_days']} days): {scope['past_retention']:,} past, "
        f"{scope['kept_for_training']:,} kept for training"
    )


if __name__ == "__main__":
    main()
