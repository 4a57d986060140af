"""A call of one worker for a caller (a model that names a worker, not a variant): the
gateway's retries, quotas, fallbacks and costs, the answer's form, what it spent counted
against the caller's key, and its outcome in the metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from conductor.answer_format import AnswerFormat, AnswerFormatError
from conductor.chat import ChatMessage, Sampling, ToolUse
from conductor.errors import StepCallFailed
from conductor.ports import DeltaSink, StepCallResult, StepRunner
from conductor.workflow import AttemptRecord, attempts_total
from conductor_adapters.store.keys import record_direct_call
from conductor_adapters.store.redact import without_addresses
from conductor_api.errors import ApiError
from conductor_api.metrics import ApiMetrics
from conductor_api.rules import Caller

logger = logging.getLogger(__name__)


class DirectCall:
    """The call, made when awaited: told the answer's form, if one is asked for, and its
    answer made to conform or failed (an answer of tool calls has no text to conform). A
    failure is an ApiError 502 that names the worker and no internal address."""

    def __init__(
        self,
        runner: StepRunner,
        engine: Engine,
        metrics: ApiMetrics,
        caller: Caller,
        worker: str,
        messages: Sequence[ChatMessage],
        *,
        answer_format: AnswerFormat | None = None,
        tools: ToolUse | None = None,
        sampling: Sampling | None = None,
    ) -> None:
        self.runner, self.engine, self.metrics = runner, engine, metrics
        self.caller, self.worker = caller, worker
        self.answer_format, self.tools, self.sampling = answer_format, tools, sampling
        if answer_format is not None:
            messages = [*messages, ChatMessage(role="system", content=answer_format.instruction())]
        self.messages = list(messages)

    async def __call__(self) -> StepCallResult:
        return await self._counted(None)

    async def stream(self) -> AsyncIterator[str | StepCallResult]:
        """The call with its answer's text as the worker writes it: the pieces, then the
        result. Whole (the result alone) where the answer is not its text as written: a
        required form, or tools."""
        if self.answer_format is not None or self.tools is not None:
            yield await self()
            return
        pieces: asyncio.Queue[str] = asyncio.Queue()
        call = asyncio.ensure_future(self._counted(pieces.put))
        try:
            while not call.done() or not pieces.empty():
                got = asyncio.ensure_future(pieces.get())
                await asyncio.wait({call, got}, return_when=asyncio.FIRST_COMPLETED)
                if got.done():
                    yield got.result()
                else:
                    got.cancel()
            yield call.result()
        finally:
            call.cancel()

    async def _counted(self, deltas: DeltaSink | None) -> StepCallResult:
        try:
            result = await self._call(deltas)
        except StepCallFailed as exc:
            self.metrics.passthrough.labels(self.worker, "failed").inc()
            # The gateway retried already (and fell back where the pool says so).
            reason = without_addresses(str(exc))
            named = reason.startswith((self.worker, f"worker {self.worker!r}"))
            message = reason if named else f"{self.worker}: {reason}"
            raise ApiError(502, message, code="worker_failed", retry=False) from None
        self.metrics.passthrough.labels(self.worker, "ok").inc()
        return result

    async def _call(self, deltas: DeltaSink | None) -> StepCallResult:
        try:
            result = await self.runner.call(
                self.worker,
                self.messages,
                allowed_workers=self.caller.allowed_pool,
                tenant=self.caller.tenant,
                tools=self.tools,
                sampling=self.sampling,
                answer_format=self.answer_format,
                deltas=deltas,
            )
        except StepCallFailed as exc:
            await self._count_spend(exc.attempts)
            raise
        await self._count_spend(result.attempts)
        if self.answer_format is None or result.tool_calls:
            return result
        try:
            text = self.answer_format.conform(result.text)
        except AnswerFormatError as exc:
            reason = f"{self.worker}: the answer does not follow the asked format: {exc}"
            raise StepCallFailed(reason, result.attempts) from None
        return result.model_copy(update={"text": text})

    async def _count_spend(self, attempts: list[AttemptRecord]) -> None:
        """What the call spent (every attempt), counted against its key's tokens per minute
        and budget as a workflow's spend is."""
        usage, cost = attempts_total(attempts)
        key_id = self.caller.key_id
        if key_id is None or not (usage.total_tokens or cost):
            return
        try:
            await asyncio.to_thread(
                record_direct_call, self.engine, key_id, self.worker, usage.total_tokens, cost
            )
        except SQLAlchemyError as exc:  # the answer is paid for: it goes out, uncounted
            logger.warning(
                "could not count a direct call of %s against its key: %s", self.worker, exc
            )
