"""Trace tables: one row per workflow, per step and per provider call (attempt).

The tables live in their own ``MetaData`` with a naming convention, so every constraint and
index has a stable name on SQLite and Postgres alike; the hand-written Alembic migrations use
the same names and a test checks that the migrated schema matches these classes exactly.

There is no Create layer: traces are written only from the domain records in
``conductor.workflow`` (``WorkflowRecord`` is the input model), never from user input.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, Dialect, Index, MetaData, Table, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import registry
from sqlalchemy.types import TypeDecorator, TypeEngine
from sqlmodel import Field, SQLModel, UTCDateTime

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# PostgreSQL refuses NUL characters in text and JSONB values (a DataError that would lose the
# write), SQLite keeps them. Traces hold untrusted text (model outputs, provider errors), so
# every text and JSON value is written with NUL replaced by U+FFFD, the same on both stores.
NUL, REPLACEMENT = "\x00", "\ufffd"


def without_nul(value: Any) -> Any:
    """``value`` with NUL replaced in every string, keys of mappings included."""
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT) if NUL in value else value
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value


class SafeText(TypeDecorator[str]):
    """TEXT, written without NUL characters."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else value.replace(NUL, REPLACEMENT)


class SafeJSON(TypeDecorator[Any]):
    """JSONB on Postgres (indexable, compact), JSON text elsewhere; written without NUL."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else JSON())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return without_nul(value)


JSON_TYPE: TypeEngine[Any] = SafeJSON()


def _json_column() -> Any:
    """A non-null JSON list; ``default=list`` also covers Core inserts, which skip pydantic."""
    return Column(JSON_TYPE, nullable=False, default=list)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class DbModel(SQLModel, registry=registry(metadata=metadata)):
    """Base of every table in the Conductor database (one metadata, one migration history)."""


class WorkflowRow(DbModel, table=True):
    """One workflow: the request, what the Conductor wrote, and what it cost."""

    __tablename__ = "workflow"

    id: uuid.UUID = Field(default_factory=uuid.uuid4, primary_key=True)
    tenant: str = Field(default="default", index=True)
    # The embedded runner (a ``conductor serve`` process) running it; NULL in distributed mode,
    # where the aggregators share the work through ``workflow_run``.
    runner_id: str | None = Field(default=None, max_length=64, index=True)
    variant: str
    question: str = Field(sa_type=SafeText)
    status: str = Field(index=True)
    # Workers as configured when the workflow ran (names of key variables, never keys).
    pool_snapshot: list[dict[str, Any]] = Field(default_factory=list, sa_column=_json_column())
    # One PlanOutcome per Conductor call: raw output, validity, errors, usage.
    planner_calls: list[dict[str, Any]] = Field(default_factory=list, sa_column=_json_column())
    # The executed steps, all rounds: {round, model_id, worker, subtask, access_list}.
    plan: list[dict[str, Any]] = Field(default_factory=list, sa_column=_json_column())
    plan_valid: bool = False
    answer: str | None = Field(default=None, sa_type=SafeText)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    feedback: float | None = None
    error: str | None = Field(default=None, sa_type=SafeText)
    # Free-form metadata the client submitted (e.g. its request id); never shown to a model.
    labels: dict[str, str] = Field(
        default_factory=dict,
        sa_column=Column(JSON_TYPE, nullable=False, default=dict, server_default=text("'{}'")),
    )
    created_at: datetime = Field(default_factory=_utcnow, sa_type=UTCDateTime(), index=True)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime())
    # A client's Idempotency-Key, unique per tenant, and the SHA-256 of the request it came
    # with: the same key and request give back this workflow; another request is refused.
    idempotency_key: str | None = Field(default=None, max_length=255)
    request_hash: str | None = Field(default=None, max_length=64)
    # The API key that submitted it (NULL: the CLI, an open server, or before keys were kept):
    # a key's limits read its workflows.
    key_id: str | None = Field(default=None, max_length=32)
    # Where the job's outcome is delivered (a webhook); NULL: its key's default, if any.
    callback_url: str | None = Field(default=None, max_length=2048)
    # When `conductor traces export` first wrote it (NULL: never): a workflow with feedback
    # or a reference label is kept past its retention until then (store/retention.py).
    exported_at: datetime | None = Field(default=None, sa_type=UTCDateTime())

    __table_args__ = (
        # A tenant's workflows, newest first, a page at a time.
        Index("ix_workflow_tenant_created", "tenant", "created_at", "id"),
        # A key's workflows of the last minute, or of its budget period.
        Index("ix_workflow_key_created", "key_id", "created_at"),
        Index(
            "ux_workflow_tenant_idempotency_key",
            "tenant",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
            sqlite_where=text("idempotency_key IS NOT NULL"),
        ),
    )


def new_workflow_values(
    workflow_id: uuid.UUID,
    *,
    tenant: str,
    variant: str,
    question: str,
    status: str,
    created_at: datetime | None,
    labels: dict[str, str] | None = None,
    runner_id: str | None = None,
    pool_snapshot: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every column of a new workflow row, for Core inserts (they skip the model's defaults,
    and building the model costs more than the insert)."""
    return {
        "id": workflow_id,
        "tenant": tenant,
        "runner_id": runner_id,
        "variant": variant,
        "question": question,
        "status": status,
        "pool_snapshot": pool_snapshot or [],
        "planner_calls": [],
        "plan": [],
        "plan_valid": False,
        "answer": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "total_tokens": 0,
        "cost_usd": 0.0,
        "latency_ms": 0.0,
        "feedback": None,
        "error": None,
        "labels": labels or {},
        "created_at": created_at or _utcnow(),
        "finished_at": None,
    }


class StepRow(DbModel, table=True):
    """One step of a workflow; ``index`` is global across recursion rounds.

    The unique (workflow_id, index) constraint is also the index for workflow_id lookups.
    """

    __tablename__ = "step"
    __table_args__ = (UniqueConstraint("workflow_id", "index"),)

    id: uuid.UUID = Field(default_factory=uuid.uuid4, primary_key=True)
    workflow_id: uuid.UUID = Field(foreign_key="workflow.id", ondelete="CASCADE")
    index: int
    round: int = 0
    kind: str = "worker"
    worker: str
    subtask: str = Field(sa_type=SafeText)
    access_list: list[int | str] = Field(default_factory=list, sa_column=_json_column())
    visible_steps: list[int] = Field(default_factory=list, sa_column=_json_column())
    status: str
    output: str | None = Field(default=None, sa_type=SafeText)
    # The client's functions the step asked to call instead of answering ({id, name,
    # arguments} each): only a workflow's answering step, offered tools, has any.
    tool_calls: list[dict[str, Any]] = Field(
        default_factory=list,
        sa_column=Column(JSON_TYPE, nullable=False, default=list, server_default=text("'[]'")),
    )
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime())
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime())
    error: str | None = Field(default=None, sa_type=SafeText)


class AttemptRow(DbModel, table=True):
    """One provider call made for a step (retries and fallbacks each get a row)."""

    __tablename__ = "attempt"
    __table_args__ = (UniqueConstraint("step_id", "number"),)

    id: uuid.UUID = Field(default_factory=uuid.uuid4, primary_key=True)
    step_id: uuid.UUID = Field(foreign_key="step.id", ondelete="CASCADE")
    number: int
    worker: str | None = None  # who was called: the step's worker or one of its fallbacks
    status: str
    error_class: str | None = None
    error: str | None = Field(default=None, sa_type=SafeText)
    status_code: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    quota_wait_ms: float = 0.0
    started_at: datetime = Field(sa_type=UTCDateTime())


class WorkflowRunRow(DbModel, table=True):
    """A workflow's live state in distributed mode: what an aggregator locks, loads and saves.

    ``state`` is a serialised conductor.machine.WorkflowState (NULL while queued); the sweeper
    finds the rows whose ``next_deadline_at`` has passed through the (status, deadline) index.
    """

    __tablename__ = "workflow_run"
    __table_args__ = (Index("ix_workflow_run_due", "status", "next_deadline_at"),)

    workflow_id: uuid.UUID = Field(foreign_key="workflow.id", primary_key=True, ondelete="CASCADE")
    status: str
    # What was submitted: question, variant, pool names, metadata.
    request: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON_TYPE, nullable=False)
    )
    state: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON_TYPE, nullable=True))
    next_deadline_at: datetime | None = Field(default=None, sa_type=UTCDateTime())
    updated_at: datetime = Field(default_factory=_utcnow, sa_type=UTCDateTime())


class OutboxRow(DbModel, table=True):
    """A queue message an aggregator's transaction calls for, stored in that transaction and
    deleted once sent: a message goes out only after the state that sends it is committed, and
    a sender that dies before sending leaves it here for the sweeper (a transactional outbox).
    """

    __tablename__ = "outbox"

    id: int | None = Field(default=None, primary_key=True)
    workflow_id: uuid.UUID = Field(foreign_key="workflow.id", ondelete="CASCADE")
    task: str = Field(max_length=100)
    queue: str = Field(max_length=200)
    args: list[Any] = Field(default_factory=list, sa_column=_json_column())
    created_at: datetime = Field(default_factory=_utcnow, sa_type=UTCDateTime(), index=True)


class WorkflowEventRow(DbModel, table=True):
    """One event of a workflow, numbered from 1: what clients stream and replay."""

    __tablename__ = "workflow_event"

    workflow_id: uuid.UUID = Field(foreign_key="workflow.id", primary_key=True, ondelete="CASCADE")
    sequence: int = Field(primary_key=True)
    kind: str
    at: datetime = Field(sa_type=UTCDateTime())
    payload: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON_TYPE, nullable=False)
    )


class RunnerRow(DbModel, table=True):
    """A live embedded runtime: it beats every few seconds; one whose beat stopped has died,
    and the workflows it ran are failed with a reason."""

    __tablename__ = "runner"

    id: str = Field(primary_key=True, max_length=64)
    started_at: datetime = Field(sa_type=UTCDateTime())
    heartbeat_at: datetime = Field(sa_type=UTCDateTime())


class ApiKeyRow(DbModel, table=True):
    """An API key: its public id and the SHA-256 of its secret, never the secret itself."""

    __tablename__ = "api_key"

    id: str = Field(primary_key=True, max_length=32)  # the key's public part, e.g. "a1b2c3d4"
    tenant: str = Field(index=True)
    secret_sha256: str
    name: str = ""
    # Worker names this key may put in a request's pool; NULL: any worker of the pool.
    allowed_pool: list[str] | None = Field(default=None, sa_column=Column(JSON_TYPE, nullable=True))
    created_at: datetime = Field(default_factory=_utcnow, sa_type=UTCDateTime())
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime())
    # Limits; NULL: none. A budget in USD per budget_period ("day" or "month", UTC).
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    max_concurrent: int | None = None
    budget_usd: float | None = None
    budget_period: str | None = Field(default=None, max_length=8)
    # The default webhook URL of its jobs, and the secret deliveries are signed with
    # (Standard Webhooks, "whsec_..."): a signing key, so it is kept, unlike the key's own.
    webhook_url: str | None = Field(default=None, max_length=2048)
    webhook_secret: str | None = Field(default=None, max_length=128)


class ResponseRow(DbModel, table=True):
    """A response of the OpenAI Responses API (``/v1/responses``): what it was asked, to be read
    back and continued. Its answer is its workflow's (``workflow_id``) or, for a worker called
    directly, ``output``. ``store`` false keeps only the id's owner and workflow; a deleted
    response keeps its row, marked and emptied, while its workflow's trace stays."""

    __tablename__ = "response"

    id: uuid.UUID = Field(primary_key=True)  # the workflow's id for a workflow's response
    tenant: str
    model: str
    workflow_id: uuid.UUID | None = Field(
        default=None, foreign_key="workflow.id", ondelete="CASCADE", index=True
    )
    store: bool = True
    # The input items as sent, each a message with its id: {id, type, role, content: [parts]}.
    input_items: list[dict[str, Any]] = Field(default_factory=list, sa_column=_json_column())
    # The conversation before them, from the chain of previous responses: [{role, content}].
    history: list[dict[str, str]] = Field(default_factory=list, sa_column=_json_column())
    instructions: str | None = Field(default=None, sa_type=SafeText)
    previous_response_id: str | None = Field(default=None, max_length=64)
    # The request's other settings, echoed in the response object (temperature, user, ...).
    settings: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON_TYPE, nullable=False, default=dict)
    )
    labels: dict[str, str] = Field(
        default_factory=dict, sa_column=Column(JSON_TYPE, nullable=False, default=dict)
    )
    # A pass-through call's result: {text, usage, conductor}; NULL for a workflow's response.
    output: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON_TYPE, nullable=True))
    created_at: datetime = Field(default_factory=_utcnow, sa_type=UTCDateTime())
    deleted_at: datetime | None = Field(default=None, sa_type=UTCDateTime())


class WebhookDeliveryRow(DbModel, table=True):
    """One workflow outcome to deliver to a webhook, and every attempt made: recorded in the
    transaction that stores the outcome, so none is left undelivered."""

    __tablename__ = "webhook_delivery"

    id: str = Field(primary_key=True, max_length=40)  # the webhook-id header: "msg_<hex>"
    workflow_id: uuid.UUID = Field(foreign_key="workflow.id", ondelete="CASCADE", index=True)
    tenant: str
    key_id: str | None = Field(default=None, max_length=32)  # whose secret signs it
    url: str = Field(max_length=2048)
    event_type: str = Field(max_length=64)  # workflow.completed, .failed or .cancelled
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=_json_column())
    status: str = Field(max_length=16)  # pending, delivered or failed (attempts spent)
    # {at, status_code, error, duration_ms} per attempt, oldest first.
    attempts: list[dict[str, Any]] = Field(default_factory=list, sa_column=_json_column())
    next_attempt_at: datetime | None = Field(default=None, sa_type=UTCDateTime())
    created_at: datetime = Field(default_factory=_utcnow, sa_type=UTCDateTime())
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime())

    __table_args__ = (Index("ix_webhook_delivery_due", "status", "next_attempt_at"),)


class DirectCallRow(DbModel, table=True):
    """A worker called directly by an API key (a pass-through, not a workflow): its tokens and
    cost, which count against the key's tokens per minute and budget as a workflow's do."""

    __tablename__ = "direct_call"

    id: int | None = Field(default=None, primary_key=True)
    key_id: str = Field(max_length=32)
    worker: str
    at: datetime = Field(sa_type=UTCDateTime())
    total_tokens: int = 0
    cost_usd: float = 0.0

    __table_args__ = (Index("ix_direct_call_key_at", "key_id", "at"),)


class TenantRetentionRow(DbModel, table=True):
    """A tenant's own retention, overriding the deployment's (CONDUCTOR_TRACE_RETENTION_DAYS):
    its workflows are kept this many days; NULL: kept forever."""

    __tablename__ = "tenant_retention"

    tenant: str = Field(primary_key=True, max_length=63)
    retention_days: int | None = None
    updated_at: datetime = Field(default_factory=_utcnow, sa_type=UTCDateTime())


workflow_table: Table = metadata.tables["workflow"]
step_table: Table = metadata.tables["step"]
attempt_table: Table = metadata.tables["attempt"]
run_table: Table = metadata.tables["workflow_run"]
event_table: Table = metadata.tables["workflow_event"]
api_key_table: Table = metadata.tables["api_key"]
runner_table: Table = metadata.tables["runner"]
response_table: Table = metadata.tables["response"]
webhook_delivery_table: Table = metadata.tables["webhook_delivery"]
direct_call_table: Table = metadata.tables["direct_call"]
outbox_table: Table = metadata.tables["outbox"]
tenant_retention_table: Table = metadata.tables["tenant_retention"]
