"""The API's application layer: one service every front door (Chat Completions, Responses,
completions, the job API, gRPC) calls, over either runtime (``conductor_api.runtime``).

It starts workflows and calls single workers for a caller, cancels, follows events, lists and
reads, and it alone admits work (the API key's pools and limits, ``admit``), makes a keyed
submission idempotent (``start_workflow``) and counts what the metrics count. A door reads its
wire format into these calls and writes their results back; it holds no rule of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy.exc import IntegrityError

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Sampling, ToolUse
from conductor.errors import InvalidRequest
from conductor.machine import FINAL_EVENT_KINDS
from conductor.variants import Variant
from conductor.workflow import WorkflowStatus
from conductor_adapters.store.keys import CachedKeys
from conductor_adapters.store.runs import SubmitRequest
from conductor_adapters.webhooks import check_url
from conductor_api.direct_calls import DirectCall
from conductor_api.errors import ApiError, unknown_model
from conductor_api.key_limits import KeyLimiter
from conductor_api.metrics import ApiMetrics
from conductor_api.reads import (
    EVENTS_PER_READ,
    WorkflowFilter,
    find_idempotent,
    list_workflows,
    load_events,
    load_workflow,
    outcome_passed,
    outcome_stored,
    workflow_status,
)
from conductor_api.rules import JOB_FIELDS, Caller, Rules, SubmitFields, request_hash
from conductor_api.runtime import WorkflowRuntime
from conductor_api.schemas import EventView, WorkflowSummary, WorkflowView

# How long a cancel waits for the cancelled outcome to be stored before it answers.
CANCEL_WAIT_S = 10.0
WAIT_MARGIN_S = 30.0  # beyond the variant's own deadline, for the outcome to be stored
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no spaces
BUDGET_HEADER = "x-conductor-budget-remaining-usd"


class IdempotencyConflict(Exception):
    """An Idempotency-Key came before with another request."""


@dataclass(frozen=True)
class Started:
    """A workflow accepted for a caller."""

    workflow_id: uuid.UUID
    variant: Variant
    status: str = "queued"  # a replay's: the status of the workflow the key made
    replayed: bool = False  # the Idempotency-Key came before with this request
    limit_headers: dict[str, str] = field(default_factory=dict)  # where the caller's key stands

    @property
    def timeout_s(self) -> float:
        """How long to wait for its answer: the variant's deadline and a margin."""
        return self.variant.workflow_timeout_s + WAIT_MARGIN_S


class WorkflowService:
    """The API over a runtime: ``variants`` are what a request may name as its model
    (``default_variant`` when it names none); ``limiter`` counts each key's requests (in this
    process unless given one on Redis); ``metrics`` is what /metrics shows."""

    def __init__(
        self,
        runtime: WorkflowRuntime,
        variants: Mapping[str, Variant],
        default_variant: str,
        *,
        limiter: KeyLimiter | None = None,
        metrics: ApiMetrics | None = None,
    ) -> None:
        self.runtime = runtime
        self.engine = runtime.engine
        self.pool = runtime.pool
        self.rules = Rules(
            runtime.worker_names, variants, default_variant, runtime.pool.tool_workers
        )
        self.limiter = limiter or KeyLimiter(self.engine)  # in memory: this process's requests
        self.metrics = metrics or ApiMetrics()
        self.keys = CachedKeys(self.engine)
        self._idempotent = asyncio.Lock()

    @property
    def mode(self) -> str:
        return self.runtime.mode

    @property
    def worker_names(self) -> list[str]:
        return self.rules.worker_names

    @property
    def variants(self) -> dict[str, Variant]:
        return self.rules.variants

    async def start(self) -> None:
        await self.runtime.start()

    async def aclose(self) -> None:
        await self.runtime.aclose()

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        """Whether the runtime is ready, and the body that says so: status, mode and each
        check (the advisory ones reported, not required)."""
        checks = await self.runtime.readiness()
        advisory = self.runtime.advisory_checks
        ready = all(value == "ok" for name, value in checks.items() if name not in advisory)
        return ready, {"status": "ready" if ready else "not ready", "mode": self.mode, **checks}

    # -- admission ----------------------------------------------------------------------------

    async def admit(self, caller: Caller, *, starts_workflow: bool) -> dict[str, str]:
        """The headers that tell the client where its key stands; ApiError 429 when the
        caller's key is at a limit (nothing is started then). Counted in the metrics."""
        try:
            headers = await self.limiter.admit(
                caller.key_id, caller.limits, starts_workflow=starts_workflow
            )
        except ApiError as refused:
            self.metrics.refused.labels(refused.code or "limit").inc()
            self._budget_seen(caller, refused.headers)
            raise
        self._budget_seen(caller, headers)
        return headers

    def _budget_seen(self, caller: Caller, headers: dict[str, str]) -> None:
        if caller.key_id is not None and BUDGET_HEADER in headers:
            self.metrics.budget_remaining.labels(caller.key_id).set(float(headers[BUDGET_HEADER]))

    # -- starting work ------------------------------------------------------------------------

    async def start_workflow(
        self,
        caller: Caller,
        question: str,
        *,
        variant: str | None = None,
        pool: Sequence[str] | None = None,
        max_steps: int | None = None,
        cost_weight: float | None = None,
        metadata: Mapping[str, str] | None = None,
        fields: SubmitFields = JOB_FIELDS,
        answer_format: AnswerFormat | None = None,
        tools: ToolUse | None = None,
        callback_url: str | None = None,
        idempotency_key: str | None = None,
        stream_answer: bool = False,
    ) -> Started:
        """Check the request against every rule, admit it, and start its workflow; with an
        ``idempotency_key``, the workflow that key made the first time (``replayed``) when it
        comes again with the same request. InvalidRequest names a field at fault; ApiError
        429 at a key's limit, 409 for a key that came with another request."""
        submission = self.rules.submission(
            caller,
            question,
            variant=variant,
            pool=pool,
            max_steps=max_steps,
            cost_weight=cost_weight,
            metadata=metadata,
            fields=fields,
            answer_format=answer_format,
            tools=tools,
        )
        if stream_answer:  # how the answer is delivered, not what is asked: not hashed
            submission = submission.model_copy(update={"stream_answer": True})
        if callback_url is not None:
            check_url(callback_url, "callback_url")
            if not caller.signs_webhooks:
                raise InvalidRequest(
                    "callback_url: this key has no webhook signing secret, and nothing unsigned "
                    "is sent: an operator makes one with `conductor keys webhook KEY_ID`",
                    param="callback_url",
                )
            submission = submission.model_copy(update={"callback_url": callback_url})
        if idempotency_key is not None and not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
            raise InvalidRequest(
                "Idempotency-Key: 1 to 255 printable ASCII characters without spaces",
                param="Idempotency-Key",
            )
        headers = await self.admit(caller, starts_workflow=True)
        if idempotency_key is None:
            workflow_id = await self.runtime.submit(submission)
        else:
            digest = request_hash(
                question,
                variant,
                pool,
                max_steps,
                cost_weight,
                metadata,
                callback_url,
                answer_format,
                tools,
            )
            keyed = submission.model_copy(
                update={"idempotency_key": idempotency_key, "request_hash": digest}
            )
            try:
                workflow_id, replayed = await self.submit_once(keyed)
            except IdempotencyConflict:
                raise ApiError(
                    409,
                    "Idempotency-Key: this key was used before with another request; use a "
                    "new key for a new request",
                    code="idempotency_key_reused",
                    param="Idempotency-Key",
                ) from None
            if replayed is not None:
                return Started(workflow_id, submission.variant, replayed, True, headers)
        self.metrics.workflows.labels(submission.variant.name).inc()
        return Started(workflow_id, submission.variant, limit_headers=headers)

    async def submit_once(self, request: SubmitRequest) -> tuple[uuid.UUID, str | None]:
        """Submit a request carrying an Idempotency-Key once: (its workflow, None) the first
        time; (the same workflow, its status now) when the key came before with the same
        request. Raises IdempotencyConflict when it came with another request."""
        assert request.idempotency_key is not None, "submit() takes requests without a key"
        key, tenant = request.idempotency_key, request.tenant
        async with self._idempotent:  # one check-then-submit at a time in this process
            found = await asyncio.to_thread(find_idempotent, self.engine, tenant, key)
            if found is None:
                try:
                    return await self.runtime.submit(request), None
                except IntegrityError:  # another replica recorded the key meanwhile
                    found = await asyncio.to_thread(find_idempotent, self.engine, tenant, key)
                    if found is None:
                        raise
        if found.request_hash != request.request_hash:
            raise IdempotencyConflict(key)
        return found.workflow_id, found.status

    async def call_worker(
        self,
        caller: Caller,
        worker: str,
        messages: Sequence[ChatMessage],
        *,
        answer_format: AnswerFormat | None = None,
        tools: ToolUse | None = None,
        sampling: Sampling | None = None,
    ) -> tuple[DirectCall, dict[str, str]]:
        """Admit a call of one worker the caller's key may use (ApiError 404 otherwise) and
        the call, made when awaited (inside a stream, if streaming), with the key's standing."""
        if worker not in self.rules.allowed_workers(caller):
            raise unknown_model(worker)
        headers = await self.admit(caller, starts_workflow=False)
        call = DirectCall(
            self.runtime.runner,
            self.engine,
            self.metrics,
            caller,
            worker,
            messages,
            answer_format=answer_format,
            tools=tools,
            sampling=sampling,
        )
        return call, headers

    # -- running workflows --------------------------------------------------------------------

    async def cancel(self, workflow_id: uuid.UUID, tenant: str, reason: str) -> None:
        """Cancel the tenant's workflow unless it has ended, and wait (``CANCEL_WAIT_S`` at
        most) for its outcome to be stored. Raises LookupError when the workflow is not the
        tenant's, WorkflowElsewhere when this process cannot reach the one that runs it."""
        status = await asyncio.to_thread(workflow_status, self.engine, workflow_id, tenant)
        if status is None:
            raise LookupError(workflow_id)
        if WorkflowStatus(status).terminal:
            return
        await self.runtime.request_cancel(workflow_id, reason)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT_S):
                await self.wait_for_outcome(workflow_id, tenant)

    async def wait_for_outcome(
        self, workflow_id: uuid.UUID, tenant: str, *, submitted_now: bool = False
    ) -> None:
        """Return once the workflow's outcome is stored. Raises LookupError when the workflow
        is not the tenant's (one running in this process is waited for as it runs).
        ``submitted_now``: the caller submitted it a moment ago, for this tenant."""
        if await self.runtime.wait_for_run(workflow_id):
            return
        await self.wait_for_stored_outcome(workflow_id, tenant, submitted_now=submitted_now)

    async def wait_for_stored_outcome(
        self, workflow_id: uuid.UUID, tenant: str, *, submitted_now: bool = False
    ) -> None:
        """``wait_for_outcome`` for a workflow run anywhere: the table is asked whether the
        outcome is stored (no event is read: a non-streamed request needs the outcome, not
        every event); after that, announcements of progress only wake the wait, and the table
        is asked again only when the wait timed out or was woken to re-read. A workflow
        ``submitted_now`` is the tenant's and has not ended unless its end was announced
        since (announced ends are remembered): the table is not asked first."""
        signals = self.runtime.signals
        finished: bool | None = False
        if not submitted_now:
            finished = await asyncio.to_thread(outcome_stored, self.engine, workflow_id, tenant)
        if finished is None:
            raise LookupError(workflow_id)
        seen, announced_finished = signals.latest(workflow_id)
        if finished or announced_finished:
            return
        while True:
            rereads = signals.rereads
            interval_s = self.runtime.poll_interval_s(workflow_id)
            woken = await signals.wait(workflow_id, seen, interval_s)
            announced, finished = signals.latest(workflow_id)
            if finished:
                return
            if announced > seen:  # progress was announced: wait on
                seen = announced
                continue
            # Woken by the announcement of an event already read: wait on. Timed out, or told
            # to re-read: the table says whether the outcome is there.
            if not woken or signals.rereads != rereads:
                stored = await asyncio.to_thread(outcome_stored, self.engine, workflow_id, tenant)
                if stored is not False:  # stored, or the workflow was deleted meanwhile
                    return

    async def follow(
        self, workflow_id: uuid.UUID, tenant: str, after: int = 0
    ) -> AsyncGenerator[EventView, None]:
        """The workflow's events after ``after``, in order, as they are stored; ends after the
        outcome. Raises LookupError at once when the workflow is not the tenant's."""
        first = True
        while True:
            events = await asyncio.to_thread(load_events, self.engine, workflow_id, tenant, after)
            if events is None:
                if first:
                    raise LookupError(workflow_id)
                return
            first = False
            for event in events:
                yield event
                after = event.sequence
                if event.kind in FINAL_EVENT_KINDS:
                    return
            # A resume point at or past the outcome: nothing more will ever come.
            if not events and await asyncio.to_thread(
                outcome_passed, self.engine, workflow_id, after
            ):
                return
            if len(events) < EVENTS_PER_READ:  # else more are stored already: read on
                # Returns at once when an event past ``after`` was announced meanwhile.
                interval_s = self.runtime.poll_interval_s(workflow_id)
                await self.runtime.signals.wait(workflow_id, after, interval_s)

    # -- reads --------------------------------------------------------------------------------

    async def read(self, workflow_id: uuid.UUID, tenant: str) -> WorkflowView | None:
        """The tenant's workflow as it is now; None when it is not the tenant's."""
        return await asyncio.to_thread(load_workflow, self.engine, workflow_id, tenant)

    async def ended(self, workflow_id: uuid.UUID, tenant: str) -> WorkflowView | None:
        """``read`` for a workflow whose answer a client waited for: counted in the metrics."""
        view = await self.read(workflow_id, tenant)
        if view is not None:
            self.metrics.workflow(tenant, view)
        return view

    async def exists(self, workflow_id: uuid.UUID, tenant: str) -> bool:
        """Whether the workflow is the tenant's."""
        found = await asyncio.to_thread(workflow_status, self.engine, workflow_id, tenant)
        return found is not None

    async def list_page(
        self, tenant: str, wanted: WorkflowFilter, *, limit: int, after: uuid.UUID | None
    ) -> tuple[list[WorkflowSummary], bool]:
        """A page of the tenant's workflows, newest first, and whether more follow; InvalidRequest
        when ``after`` names no workflow of the tenant's."""
        found = await asyncio.to_thread(
            list_workflows, self.engine, tenant, wanted, limit=limit, after=after
        )
        if found is None:
            raise InvalidRequest(f"after: no workflow {after} to continue from", param="after")
        return found

    def allowed_workers(self, caller: Caller) -> list[str]:
        return self.rules.allowed_workers(caller)
