"""The ``sim`` provider's adapter: simulated answers with the latency their profile gives."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from conductor.chat import ChatMessage, Completion
from conductor.evaluation.sim import simulate
from conductor.pool import SimProfile, WorkerSpec
from conductor.streaming import WholeAnswerStream


class SimWorker(WholeAnswerStream):
    def __init__(self, name: str, model: str, profile: SimProfile) -> None:
        self.name = name
        self.model = model
        self.profile = profile

    @classmethod
    def from_spec(cls, spec: WorkerSpec) -> SimWorker:
        assert spec.sim is not None  # WorkerSpec refuses a sim worker without its profile
        return cls(spec.name, spec.model, spec.sim)

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        answer = await simulate(self.name, self.profile, messages)
        await asyncio.sleep(answer.latency_s)
        return Completion(
            text=answer.text, usage=answer.usage, model=self.model, finish_reason="stop"
        )

    async def aclose(self) -> None:
        """Nothing to release."""
