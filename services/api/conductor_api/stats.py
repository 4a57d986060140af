"""``GET /v1/stats``: what a tenant's workflows did over a span of time, for the summary page
of the trace viewer and for anyone who would rather not write SQL: workflows, tokens and cost
per time bucket by variant and by worker, the valid-plan rate, failure reasons, and latency
percentiles.

Rows are read once for the span (the columns the figures need) and added up here rather than
in SQL, so both stores (SQLite and PostgreSQL, which truncate dates differently) give the same
figures; a week of tens of thousands of workflows reads in well under a second.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel
from sqlalchemy import Engine, select

from conductor_adapters.store.models import step_table, workflow_table
from conductor_adapters.store.redact import without_addresses
from conductor_api.auth import CallerDep, ServiceDep
from conductor_api.errors import ApiError
from conductor_api.reads import as_utc

router = APIRouter(prefix="/v1/stats", tags=["Job API"])

Bucket = Literal["hour", "day"]
DEFAULT_SPAN = timedelta(days=7)
MAX_BUCKETS = 2000  # a span cut into more buckets than this is refused (a chart of noise)
MAX_SPAN = timedelta(days=400)  # every row of the span is read: a bound on one request's work
REASON_CHARS = 120  # failure reasons are grouped by their start (ids and numbers follow)


class Totals(BaseModel):
    workflows: int
    completed: int
    failed: int
    cancelled: int
    running: int
    queued: int
    tokens: int
    cost_usd: float
    valid_plan_rate: float | None  # of the workflows whose Conductor wrote a plan
    latency_ms_p50: float | None  # of the workflows that ended
    latency_ms_p95: float | None


class VariantBucket(BaseModel):
    start: datetime
    variant: str
    workflows: int
    tokens: int
    cost_usd: float


class WorkerBucket(BaseModel):
    start: datetime
    worker: str
    steps: int
    tokens: int
    cost_usd: float


class FailureReason(BaseModel):
    reason: str
    count: int


class Stats(BaseModel):
    object: Literal["stats"] = "stats"
    bucket: Bucket
    created_after: datetime
    created_before: datetime
    totals: Totals
    by_variant: list[VariantBucket]
    by_worker: list[WorkerBucket]
    failure_reasons: list[FailureReason]


def bucket_start(moment: datetime, bucket: Bucket) -> datetime:
    moment = moment.astimezone(UTC)
    hour = moment.replace(minute=0, second=0, microsecond=0)
    return hour if bucket == "hour" else hour.replace(hour=0)


def percentile(values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (``share`` 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def reason_of(error: str | None) -> str:
    """A failure's reason as grouped: its first line, without internal addresses (they stay in
    the trace, as in every error a client reads)."""
    first_line = without_addresses(error or "no reason recorded").strip().splitlines()[0]
    return first_line[:REASON_CHARS]


def read_stats(
    engine: Engine, tenant: str, since: datetime, until: datetime, bucket: Bucket
) -> Stats:
    table, steps = workflow_table, step_table
    in_span = (table.c.tenant == tenant, table.c.created_at >= since, table.c.created_at < until)
    with engine.connect() as conn:
        workflows = conn.execute(
            select(
                table.c.status,
                table.c.variant,
                table.c.total_tokens,
                table.c.cost_usd,
                table.c.latency_ms,
                table.c.plan_valid,
                table.c.planner_calls,
                table.c.error,
                table.c.created_at,
            ).where(*in_span)
        ).all()
        step_rows = conn.execute(
            select(
                steps.c.worker,
                steps.c.total_tokens,
                steps.c.cost_usd,
                table.c.created_at,
            )
            .join(table, table.c.id == steps.c.workflow_id)
            .where(*in_span, steps.c.kind == "worker")
        ).all()
    statuses = Counter(row.status for row in workflows)
    planned = [row.plan_valid for row in workflows if row.planner_calls]
    ended = [row.latency_ms for row in workflows if row.status in ("completed", "failed")]
    totals = Totals(
        workflows=len(workflows),
        completed=statuses["completed"],
        failed=statuses["failed"],
        cancelled=statuses["cancelled"],
        running=statuses["running"],
        queued=statuses["queued"],
        tokens=sum(row.total_tokens for row in workflows),
        cost_usd=sum(row.cost_usd for row in workflows),
        valid_plan_rate=sum(planned) / len(planned) if planned else None,
        latency_ms_p50=percentile(ended, 0.50),
        latency_ms_p95=percentile(ended, 0.95),
    )
    return Stats(
        bucket=bucket,
        created_after=since,
        created_before=until,
        totals=totals,
        by_variant=_by_variant(workflows, bucket),
        by_worker=_by_worker(step_rows, bucket),
        failure_reasons=[
            FailureReason(reason=reason, count=count)
            for reason, count in Counter(
                reason_of(row.error) for row in workflows if row.status == "failed"
            ).most_common(20)
        ],
    )


def _sums(
    rows: Iterable[Any], bucket: Bucket, name: str
) -> list[tuple[datetime, str, int, int, float]]:
    """(bucket start, the row's ``name`` column, rows, tokens, cost) per bucket and name."""
    sums: dict[tuple[datetime, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for row in rows:
        entry = sums[(bucket_start(row.created_at, bucket), getattr(row, name))]
        entry[0] += 1
        entry[1] += row.total_tokens
        entry[2] += row.cost_usd
    return [(start, key, int(n), int(t), c) for (start, key), (n, t, c) in sorted(sums.items())]


def _by_variant(rows: Iterable[Any], bucket: Bucket) -> list[VariantBucket]:
    return [
        VariantBucket(start=start, variant=variant, workflows=n, tokens=t, cost_usd=c)
        for start, variant, n, t, c in _sums(rows, bucket, "variant")
    ]


def _by_worker(rows: Iterable[Any], bucket: Bucket) -> list[WorkerBucket]:
    return [
        WorkerBucket(start=start, worker=worker, steps=n, tokens=t, cost_usd=c)
        for start, worker, n, t, c in _sums(rows, bucket, "worker")
    ]


@router.get("", response_model=Stats)
async def stats(
    service: ServiceDep,
    caller: CallerDep,
    created_after: Annotated[
        datetime | None, Query(description="From (ISO 8601 or Unix seconds); default: a week ago.")
    ] = None,
    created_before: Annotated[datetime | None, Query(description="Until; default: now.")] = None,
    bucket: Annotated[Bucket, Query(description="The time step of the series.")] = "day",
) -> Stats:
    """The key's tenant's workflows created in the span: totals, series by variant and by
    worker, failure reasons, latency percentiles."""
    until = as_utc(created_before) or datetime.now(UTC)
    try:
        since = as_utc(created_after) or until - DEFAULT_SPAN
    except OverflowError:  # a created_before in the first week of year 1
        raise ApiError(400, "created_before: too early", param="created_before") from None
    if since >= until:
        raise ApiError(400, "created_after: must be before created_before", param="created_after")
    if until - since > MAX_SPAN:
        raise ApiError(
            400,
            f"created_after: a span of at most {MAX_SPAN.days} days, not {(until - since).days}",
            param="created_after",
        )
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    if (until - since) / step > MAX_BUCKETS:
        raise ApiError(
            400,
            f"bucket: {bucket}s over this span make more than {MAX_BUCKETS} points; "
            "choose day or a shorter span",
            param="bucket",
        )
    return await asyncio.to_thread(read_stats, service.engine, caller.tenant, since, until, bucket)
