"""The aggregator's settings (prefix ``CONDUCTOR_``): broker, Redis, planner, sweeping."""

from __future__ import annotations

from pydantic import Field

from conductor_adapters.settings import BrokerSettings, load_settings


class AggregatorSettings(BrokerSettings):
    # Queue messages one aggregator process handles at once (Celery thread-pool size). Most
    # take milliseconds; a planning round waits on the planner for seconds.
    aggregator_concurrency: int = Field(default=32, ge=1, le=1000)
    # How often each aggregator looks for passed deadlines and lost start messages.
    sweep_interval_s: float = Field(default=2.0, gt=0)
    # One Plan call's deadline, and how often an unreachable planner is tried again (with
    # backoff) before the planning round fails.
    planner_timeout_s: float = Field(default=300.0, gt=0)
    planner_retries: int = Field(default=8, ge=0, le=100)

    @classmethod
    def load(cls) -> AggregatorSettings:
        return load_settings(cls)
