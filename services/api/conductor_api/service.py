"""What the HTTP and gRPC front ends need from a runtime, and the rules they share.

``WorkflowService`` has two implementations: embedded (the executor in this process) and
distributed (submit through the broker; aggregators run the workflow). Both write the same
trace tables, so reads (conductor_api.reads) and event streams are shared; the services only
differ in how work starts and how new events are announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Sampling, ToolUse
from conductor.errors import InvalidRequest
from conductor.machine import FINAL_EVENT_KINDS
from conductor.orchestration import check_question, check_text
from conductor.pool import Pool
from conductor.ports import StepCallResult
from conductor.variants import MAX_STEPS_LIMIT, Variant, get_variant
from conductor.workflow import WorkflowStatus
from conductor_adapters.store.keys import CachedKeys, KeyLimits
from conductor_adapters.store.runs import SubmitRequest
from conductor_api.key_limits import KeyLimiter
from conductor_api.reads import (
    EVENTS_PER_READ,
    find_idempotent,
    load_events,
    outcome_passed,
    outcome_stored,
    workflow_status,
)
from conductor_api.schemas import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_NAME_CHARS,
    EventView,
)

# A reader re-reads a workflow's events this often when announcements may not reach it (a
# workflow run by another process, announcements interrupted)...
POLL_INTERVAL_S = 1.0
# ...and this often when every event is announced to it: a safety net only, so the CPU a
# waiting reader costs does not grow with how long it waits.
ANNOUNCED_POLL_S = 10.0
# How long a cancel waits for the cancelled outcome to be stored before it answers.
CANCEL_WAIT_S = 10.0


class WorkflowElsewhere(Exception):
    """The workflow runs in another process, which this one cannot reach to cancel it."""


class IdempotencyConflict(Exception):
    """An Idempotency-Key came before with another request."""


@dataclass(frozen=True)
class SubmitFields:
    """What a front end calls each part of a submission, for the errors that name it."""

    question: str = "question"
    variant: str = "variant"
    pool: str = "pool"
    max_steps: str = "max_steps"
    cost_weight: str = "cost_weight"
    labels: str = "metadata"


# The job API's and gRPC's names; chat completions carry the options under "conductor".
JOB_FIELDS = SubmitFields()
CHAT_FIELDS = SubmitFields(
    question="messages",
    variant="model",
    pool="conductor.pool",
    max_steps="conductor.max_steps",
    cost_weight="conductor.cost_weight",
)


def check_labels(labels: Mapping[str, str], field: str) -> None:
    """The HTTP schemas' limits on labels, for every front end (gRPC's arrive unchecked)."""
    if len(labels) > MAX_LABELS:
        raise InvalidRequest(
            f"{field}: at most {MAX_LABELS} labels, not {len(labels)}", param=field
        )
    for key, value in labels.items():
        if not 1 <= len(key) <= MAX_NAME_CHARS:
            raise InvalidRequest(
                f"{field}: a label's name has 1 to {MAX_NAME_CHARS} characters, not {len(key)}",
                param=field,
            )
        if len(value) > MAX_LABEL_VALUE_CHARS:
            raise InvalidRequest(
                f"{field}: the label {key!r} is longer than {MAX_LABEL_VALUE_CHARS} characters",
                param=field,
            )
        try:
            check_text(f"the label {key!r}", key + value)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{field}: {exc}", param=field) from None


@dataclass(frozen=True)
class Caller:
    """Who is calling: the API key's tenant and the workers it may use (None: any)."""

    tenant: str
    allowed_pool: tuple[str, ...] | None = None
    key_id: str | None = None
    limits: KeyLimits | None = None
    signs_webhooks: bool = False  # its key has a webhook signing secret


class EventSignals:
    """Wakes the readers of a workflow's events when new ones are stored.

    Announcements are a shortcut, not the source of truth: readers re-read the table at least
    every ``WorkflowService.poll_interval_s``, so a lost announcement delays an event, never
    drops it.
    """

    # Finished workflows whose last sequence is remembered: a reader that read just before the
    # final event and waits just after its announcement returns at once instead of polling.
    FINISHED_KEPT = 10_000

    def __init__(self) -> None:
        self._latest: dict[uuid.UUID, int] = {}
        self._wakeups: dict[uuid.UUID, asyncio.Event] = {}
        self._finished: OrderedDict[uuid.UUID, int] = OrderedDict()
        self.rereads = 0  # times every reader was told to re-read (announcements were missed)

    def announce(self, workflow_id: uuid.UUID, sequence: int, *, final: bool = False) -> None:
        self._latest[workflow_id] = max(sequence, self._latest.get(workflow_id, 0))
        wakeup = self._wakeups.pop(workflow_id, None)
        if wakeup is not None:
            wakeup.set()
        if final:
            self._finished[workflow_id] = self._latest.pop(workflow_id)
            while len(self._finished) > self.FINISHED_KEPT:
                self._finished.popitem(last=False)

    def latest(self, workflow_id: uuid.UUID) -> tuple[int, bool]:
        """The last sequence announced for the workflow, and whether it was its outcome."""
        if workflow_id in self._finished:
            return self._finished[workflow_id], True
        return self._latest.get(workflow_id, 0), False

    def wake_all(self) -> None:
        """Wake every waiting reader to re-read: announcements may have been missed."""
        self.rereads += 1
        wakeups, self._wakeups = self._wakeups, {}
        for wakeup in wakeups.values():
            wakeup.set()

    async def wait(self, workflow_id: uuid.UUID, after: int, timeout_s: float) -> bool:
        """Wait for an announcement past ``after``; False when ``timeout_s`` passed first."""
        latest, _ = self.latest(workflow_id)
        if latest > after:
            return True
        wakeup = self._wakeups.setdefault(workflow_id, asyncio.Event())
        try:
            await asyncio.wait_for(wakeup.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class WorkflowService(ABC):
    """A runtime behind the API: starts workflows and pass-through calls."""

    mode: str

    def __init__(
        self,
        engine: Engine,
        pool: Pool,
        variants: Mapping[str, Variant],
        default_variant: str,
        *,
        limiter: KeyLimiter | None = None,
    ) -> None:
        self.engine = engine
        self.limiter = limiter or KeyLimiter(engine)  # in memory: this process's requests
        self.pool = pool
        self.variants = dict(variants)
        self.default_variant = default_variant
        self.signals = EventSignals()
        self.keys = CachedKeys(engine)
        self._idempotent = asyncio.Lock()

    def poll_interval_s(self, workflow_id: uuid.UUID) -> float:
        """How long a reader of ``workflow_id`` waits for an announcement before re-reading."""
        return POLL_INTERVAL_S

    @property
    @abstractmethod
    def worker_names(self) -> list[str]:
        """Workers a request may name, in pool order."""

    @abstractmethod
    async def submit(self, request: SubmitRequest) -> uuid.UUID:
        """Record the workflow (queued, with its tenant) and start it; returns at once."""

    @abstractmethod
    async def passthrough(
        self,
        worker: str,
        messages: Sequence[ChatMessage],
        *,
        allowed_workers: Collection[str] | None = None,
        tenant: str | None = None,
        tools: ToolUse | None = None,
        sampling: Sampling | None = None,
    ) -> StepCallResult:
        """One call to one worker, with the gateway's retries, quotas and costs; its fallbacks
        only among ``allowed_workers`` (the caller's key's pool; None: any); ``tenant``'s
        fair turn among calls waiting on the worker's quotas; ``tools`` the functions it may
        ask the client to call; ``sampling`` the request's own max_tokens and temperature."""

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
                    return await self.submit(request), None
                except IntegrityError:  # another replica recorded the key meanwhile
                    found = await asyncio.to_thread(find_idempotent, self.engine, tenant, key)
                    if found is None:
                        raise
        if found.request_hash != request.request_hash:
            raise IdempotencyConflict(key)
        return found.workflow_id, found.status

    @abstractmethod
    async def request_cancel(self, workflow_id: uuid.UUID, reason: str) -> None:
        """Ask the runtime to end a running or queued workflow cancelled (``cancel`` checks
        first that it is the caller's and still running)."""

    async def cancel(self, workflow_id: uuid.UUID, tenant: str, reason: str) -> None:
        """Cancel the tenant's workflow unless it has ended, and wait (``CANCEL_WAIT_S`` at
        most) for its outcome to be stored. Raises LookupError when the workflow is not the
        tenant's, WorkflowElsewhere when this process cannot reach the one that runs it."""
        status = await asyncio.to_thread(workflow_status, self.engine, workflow_id, tenant)
        if status is None:
            raise LookupError(workflow_id)
        if WorkflowStatus(status).terminal:
            return
        await self.request_cancel(workflow_id, reason)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT_S):
                await self.wait_for_outcome(workflow_id, tenant)

    # Checks /readyz reports without failing on: a dependency every replica shares, whose
    # outage taking every API pod out of its Service would turn clear errors into refused
    # connections, and stop the job API from accepting work that waits for it.
    advisory_checks: frozenset[str] = frozenset()

    @abstractmethod
    async def readiness(self) -> dict[str, str]:
        """Each dependency and "ok", or what is wrong with it."""

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    # -- shared rules -----------------------------------------------------------------------

    def variant_for(
        self,
        name: str | None,
        max_steps: int | None,
        cost_weight: float | None = None,
        fields: SubmitFields = JOB_FIELDS,
    ) -> Variant:
        """The variant a request names (the default when it names none), with its max_steps
        and router cost weight. Checked here, not only by the HTTP schemas: gRPC requests
        arrive unvalidated."""
        try:
            variant = get_variant(name or self.default_variant, self.variants)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{fields.variant}: {exc}", param=fields.variant) from None
        if max_steps is not None:
            if not 1 <= max_steps <= MAX_STEPS_LIMIT:
                raise InvalidRequest(
                    f"{fields.max_steps} must be 1 to {MAX_STEPS_LIMIT}, not {max_steps}",
                    param=fields.max_steps,
                )
            variant = variant.model_copy(update={"max_steps": max_steps})
        if cost_weight is not None:
            if not math.isfinite(cost_weight) or cost_weight < 0:
                raise InvalidRequest(
                    f"{fields.cost_weight} must be a number >= 0, not {cost_weight}",
                    param=fields.cost_weight,
                )
            variant = variant.model_copy(update={"router_cost_weight": cost_weight})
        return variant

    def allowed_workers(self, caller: Caller) -> list[str]:
        names = self.worker_names
        if caller.allowed_pool is None:
            return names
        return [n for n in names if n in caller.allowed_pool]

    def resolve_pool(
        self, caller: Caller, requested: Sequence[str] | None, fields: SubmitFields = JOB_FIELDS
    ) -> list[str] | None:
        """The workers a request may use: what it asked for, checked against the pool and the
        caller's key; None means every worker of the pool (a key without limits)."""
        if requested is None:
            return None if caller.allowed_pool is None else list(caller.allowed_pool)
        wanted = list(dict.fromkeys(requested))
        if caller.allowed_pool is not None:
            # One answer whether a name is in the pool or not: a key limited to some workers
            # learns nothing of the others, not even which names exist.
            allowed = self.allowed_workers(caller)
            refused = [n for n in wanted if n not in allowed]
            if refused:
                raise InvalidRequest(
                    f"{fields.pool}: this API key may not use {', '.join(refused)} "
                    f"(allowed: {', '.join(allowed) or 'none'})",
                    param=fields.pool,
                )
            return wanted
        unknown = [n for n in wanted if n not in self.worker_names]
        if unknown:
            raise InvalidRequest(
                f"{fields.pool}: workers not in the pool: {', '.join(unknown)} "
                f"(known: {', '.join(self.worker_names)})",
                param=fields.pool,
            )
        return wanted

    def submission(
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
    ) -> SubmitRequest:
        """A request checked against every rule before anything is recorded: the question,
        the variant, max_steps, the labels, and the pool against the pool and the caller's
        key. Errors name the field at fault as ``fields`` calls it. ``answer_format`` comes
        checked by the front end that read it (its schema is one)."""
        try:
            check_question(question)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{fields.question}: {exc}", param=fields.question) from None
        labels = dict(metadata or {})
        check_labels(labels, fields.labels)
        return SubmitRequest(
            question=question,
            variant=self.variant_for(variant, max_steps, cost_weight, fields),
            pool=self.resolve_pool(caller, pool, fields),
            tenant=caller.tenant,
            metadata=labels,
            answer_format=answer_format,
            key_id=caller.key_id,
        )

    async def wait_for_outcome(self, workflow_id: uuid.UUID, tenant: str) -> None:
        """Return once the workflow's outcome is stored. Raises LookupError when the workflow
        is not the tenant's.

        The table is asked whether the outcome is stored (no event is read: a non-streamed
        request needs the outcome, not every event); after that, announcements of progress only
        wake the wait, and the table is asked again only when the wait timed out or was woken
        to re-read."""
        finished = await asyncio.to_thread(outcome_stored, self.engine, workflow_id, tenant)
        if finished is None:
            raise LookupError(workflow_id)
        seen, announced_finished = self.signals.latest(workflow_id)
        if finished or announced_finished:
            return
        while True:
            rereads = self.signals.rereads
            woken = await self.signals.wait(workflow_id, seen, self.poll_interval_s(workflow_id))
            announced, finished = self.signals.latest(workflow_id)
            if finished:
                return
            if announced > seen:  # progress was announced: wait on
                seen = announced
                continue
            # Woken by the announcement of an event already read: wait on. Timed out, or told
            # to re-read: the table says whether the outcome is there.
            if not woken or self.signals.rereads != rereads:
                stored = await asyncio.to_thread(outcome_stored, self.engine, workflow_id, tenant)
                if stored is not False:  # stored, or the workflow was deleted meanwhile
                    return

    async def follow(
        self, workflow_id: uuid.UUID, tenant: str, after: int = 0
    ) -> AsyncIterator[EventView]:
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
                await self.signals.wait(workflow_id, after, self.poll_interval_s(workflow_id))
