"""The worker gateway: one step's call to a worker LLM, made dependable.

For each attempt: take the worker's quota lease (waiting if over quota), call the provider
(whole or streamed), settle the lease with the real token count, price the attempt, record it.
Failures go through the one retry policy; when a worker's retries are exhausted (or its key is
refused) its fallbacks are tried in order. The result carries every attempt, so the trace shows
what each try cost and why it failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Completion, Sampling, ToolUse
from conductor.errors import (
    ProviderAuthError,
    ProviderTimeout,
    QuotaExhausted,
    StepCallFailed,
    WorkerError,
    WorkerUnavailable,
)
from conductor.pool import IMAGE_PROVIDERS, TOOL_CALLING_PROVIDERS, Pool, WorkerSpec
from conductor.ports import (
    ChatWorker,
    DeltaSink,
    FormattedAnswerWorker,
    StepCallResult,
    ToolCallingWorker,
)
from conductor.streaming import StreamEvent, TextDelta, collect_stream
from conductor.tracing import add_event, end_provider_call, provider_call_span
from conductor.workflow import AttemptRecord, attempts_total
from conductor_gateway.metrics import GatewayMetrics
from conductor_gateway.quotas import MemoryQuotas, QuotaStore, estimate_tokens
from conductor_gateway.retry import RetryPolicy

logger = logging.getLogger(__name__)

# A fallback is worth trying when the worker is down or refuses our key, not when the request
# itself was rejected (a 400 would be rejected by the fallback as well).
FALLBACK_ON = (ProviderAuthError, QuotaExhausted, WorkerUnavailable)


@dataclass(frozen=True)
class _Call:
    """What one step's call sends, whichever worker of its fallbacks answers it."""

    messages: Sequence[ChatMessage]
    tenant: str | None
    tools: ToolUse | None
    sampling: Sampling | None
    answer_format: AnswerFormat | None = None
    deltas: DeltaSink | None = None
    # Set once text went to ``deltas``: the call's receiver has shown it, so no retry.
    forwarded: list[bool] = field(default_factory=list)

    def max_tokens(self, spec: WorkerSpec) -> int:
        asked = self.sampling.max_tokens if self.sampling else None
        return spec.max_tokens if asked is None else min(asked, spec.max_tokens)

    def temperature(self, spec: WorkerSpec) -> float:
        asked = self.sampling.temperature if self.sampling else None
        return spec.temperature if asked is None else asked


async def _forwarding(
    events: AsyncIterator[StreamEvent], call: _Call
) -> AsyncIterator[StreamEvent]:
    """The stream, its text handed to the call's receiver as it arrives."""
    assert call.deltas is not None
    async for event in events:
        if isinstance(event, TextDelta) and event.text:
            call.forwarded.append(True)
            await call.deltas(event.text)
        yield event


class WorkerGateway:
    """Implements the StepRunner port in-process; the Celery task runs the same object."""

    def __init__(
        self,
        pool: Pool,
        workers: Mapping[str, ChatWorker],
        *,
        quotas: QuotaStore | None = None,
        policy: RetryPolicy | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.pool = pool
        self.workers = dict(workers)
        self.quotas: QuotaStore = quotas if quotas is not None else MemoryQuotas()
        self.policy = policy or RetryPolicy()
        self.metrics = metrics

    @classmethod
    def in_process(cls, pool: Pool, workers: Mapping[str, ChatWorker]) -> WorkerGateway:
        """The embedded runtime's gateway: retry policy and quotas from the environment, the
        quotas kept in this process's memory."""
        from conductor_gateway.settings import GatewaySettings

        settings = GatewaySettings.load()
        return cls(
            pool,
            workers,
            quotas=MemoryQuotas(settings.quota_config()),
            policy=settings.retry_policy(),
        )

    @property
    def worker_names(self) -> frozenset[str]:
        return frozenset(self.workers)

    async def call(
        self,
        worker: str,
        messages: Sequence[ChatMessage],
        *,
        allowed_workers: Collection[str] | None = None,
        tenant: str | None = None,
        tools: ToolUse | None = None,
        sampling: Sampling | None = None,
        attempts: list[AttemptRecord] | None = None,
        answer_format: AnswerFormat | None = None,
        deltas: DeltaSink | None = None,
    ) -> StepCallResult:
        spec = self.pool.get(worker)
        allowed = None if allowed_workers is None else frozenset(allowed_workers)
        if allowed is not None and worker not in allowed:
            raise StepCallFailed(f"{worker}: not among the workers this request may use", [])
        # The caller's list, if it gave one: it keeps the calls made if it cancels this one.
        attempts = [] if attempts is None else attempts
        errors: list[str] = []
        # Fallbacks outside the request's workers are skipped without a word: naming them would
        # tell a limited API key about workers it may not see.
        reachable = [n for n in spec.fallbacks if allowed is None or n in allowed]
        call = _Call(messages, tenant, tools, sampling, answer_format, deltas)
        for name in (worker, *reachable):
            if name not in self.workers:
                errors.append(f"{name}: not callable here")
                continue
            refusal = self._cannot_take(name, messages, tools)
            if refusal is not None:
                errors.append(f"{name}: {refusal}")
                continue
            if name != worker and self.metrics is not None:
                self.metrics.fallback(self.pool.get(name))
            try:
                completion = await self._call_with_retries(self.pool.get(name), call, attempts)
            except WorkerError as exc:
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                # Text that went out streamed is not written again by a fallback.
                if call.forwarded or not (exc.retryable or isinstance(exc, FALLBACK_ON)):
                    break
                continue
            usage, cost = attempts_total(attempts)
            return StepCallResult(
                text=completion.text,
                worker=name,
                finish_reason=completion.finish_reason,
                usage=usage,
                cost_usd=cost,
                attempts=attempts,
                tool_calls=list(completion.tool_calls),
            )
        raise StepCallFailed("; ".join(errors) or f"{worker}: no attempt made", attempts)

    def _cannot_take(
        self, name: str, messages: Sequence[ChatMessage], tools: ToolUse | None
    ) -> str | None:
        """Why worker ``name`` cannot take this call whole (a fallback that would drop its
        tools, tool turns or images is skipped, never sent a lesser request); None if it can."""
        provider = self.pool.get(name).provider
        uses_tools = tools is not None or any(m.tool_calls or m.role == "tool" for m in messages)
        if uses_tools and not (
            isinstance(self.workers[name], ToolCallingWorker) and provider in TOOL_CALLING_PROVIDERS
        ):
            return "its wire format takes no tools"
        if any(m.images for m in messages) and provider not in IMAGE_PROVIDERS:
            return "it is not sent images"
        return None

    async def _call_with_retries(
        self, spec: WorkerSpec, call: _Call, attempts: list[AttemptRecord]
    ) -> Completion:
        for tries in range(1, self.policy.max_attempts + 1):
            made = len(attempts)
            try:
                completion = await self._attempt(spec, call, attempts)
            except WorkerError as exc:
                self._observe(spec, attempts, made)
                if call.forwarded or not self.policy.should_retry(exc, tries):
                    raise
                if self.metrics is not None:
                    self.metrics.retry(spec)
                delay = self.policy.delay_s(exc, tries)
                add_event(
                    "retry",
                    {"conductor.worker": spec.name, "conductor.attempt": tries, "delay_s": delay},
                )
                logger.info(
                    "worker %s attempt %d failed (%s); retrying in %.2f s",
                    spec.name,
                    tries,
                    type(exc).__name__,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            self._observe(spec, attempts, made)
            return completion
        raise AssertionError("unreachable: the last attempt either returns or raises")

    def _observe(self, spec: WorkerSpec, attempts: list[AttemptRecord], before: int) -> None:
        """Count the attempt just made, if one was (waiting for a quota can fail first)."""
        if self.metrics is not None and len(attempts) > before:
            self.metrics.attempt(spec, attempts[-1])

    async def _attempt(
        self, spec: WorkerSpec, call: _Call, attempts: list[AttemptRecord]
    ) -> Completion:
        """One provider call under the worker's quotas (taking the tenant's fair turn among the
        calls waiting); recorded whatever happens, and traced (the quota wait inside)."""
        with provider_call_span(
            spec,
            call.messages,
            max_tokens=call.max_tokens(spec),
            temperature=call.temperature(spec),
            attempt=len(attempts) + 1,
        ) as span:
            try:
                completion = await self._leased_attempt(spec, call, attempts)
            except BaseException as exc:
                end_provider_call(span, None, exc)
                raise
            end_provider_call(span, completion, cost_usd=attempts[-1].cost_usd)
            return completion

    async def _leased_attempt(
        self, spec: WorkerSpec, call: _Call, attempts: list[AttemptRecord]
    ) -> Completion:
        estimate = estimate_tokens(call.messages, call.max_tokens(spec), call.tools)
        lease = await self.quotas.acquire(spec.name, spec.quotas, estimate, call.tenant)
        if lease.waited_s:
            add_event("quota wait", {"conductor.quota_wait_ms": lease.waited_s * 1000})
        started_at, clock = datetime.now(UTC), time.perf_counter()
        record = AttemptRecord(
            number=len(attempts) + 1,
            worker=spec.name,
            status="error",
            quota_wait_ms=lease.waited_s * 1000,
            started_at=started_at,
        )
        attempts.append(record)
        tokens: int | None = None  # None keeps the estimate: the real count is unknown
        try:
            completion = await self._call_provider(spec, call)
            tokens = completion.usage.total_tokens
        except WorkerError as exc:
            # An error status means the provider generated nothing; a broken call may have.
            tokens = 0 if exc.status_code is not None else None
            record.error_class, record.error = type(exc).__name__, str(exc)[:1000]
            record.status_code = exc.status_code
            raise
        except Exception as exc:
            record.error_class, record.error = type(exc).__name__, str(exc)[:1000]
            raise WorkerError(f"worker {spec.name!r}: {type(exc).__name__}: {exc}") from exc
        finally:
            record.latency_ms = (time.perf_counter() - clock) * 1000
            # Shielded: a cancelled step still frees its concurrency slot.
            await asyncio.shield(lease.settle(tokens))
        record.status, record.usage = "ok", completion.usage
        # A cost the worker knows (a recorded one, replayed) stands; otherwise the pool prices.
        record.cost_usd = (
            spec.price.cost(completion.usage)
            if completion.cost_usd is None
            else completion.cost_usd
        )
        return completion

    async def _call_provider(self, spec: WorkerSpec, call: _Call) -> Completion:
        worker, messages = self.workers[spec.name], call.messages
        max_tokens, temperature = call.max_tokens(spec), call.temperature(spec)
        try:
            async with asyncio.timeout(spec.timeout_s):
                if call.tools is not None and isinstance(worker, ToolCallingWorker):
                    # Whole, not streamed: the calls come back as one answer to the client.
                    return await worker.complete_with_tools(
                        messages, call.tools, max_tokens=max_tokens, temperature=temperature
                    )
                form = call.answer_format
                if form is not None and isinstance(worker, FormattedAnswerWorker):
                    # Whole: the provider constrains the answer to the JSON asked for.
                    return await worker.complete_in_format(
                        messages, form, max_tokens=max_tokens, temperature=temperature
                    )
                if call.deltas is not None or spec.stream:
                    events = worker.stream(messages, max_tokens=max_tokens, temperature=temperature)
                    if call.deltas is not None:
                        events = _forwarding(events, call)
                    return await collect_stream(events, f"worker {spec.name!r}")
                return await worker.complete(
                    messages, max_tokens=max_tokens, temperature=temperature
                )
        except TimeoutError as exc:
            raise ProviderTimeout(
                f"worker {spec.name!r}: no complete answer within {spec.timeout_s:g} s"
            ) from exc

    async def aclose(self) -> None:
        for worker in self.workers.values():
            await worker.aclose()
