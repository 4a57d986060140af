"""The worker gateway's settings (prefix ``CONDUCTOR_``): broker, Redis, retries, quotas."""

from __future__ import annotations

from pydantic import Field

from conductor_adapters.settings import BrokerSettings, load_settings
from conductor_gateway.quotas import QuotaConfig
from conductor_gateway.retry import RetryPolicy


class GatewaySettings(BrokerSettings):
    retry_max_attempts: int = Field(default=4, ge=1, le=20)
    retry_base_delay_s: float = Field(default=0.5, ge=0)
    retry_max_delay_s: float = Field(default=20.0, ge=0)
    retry_after_cap_s: float = Field(default=60.0, ge=0)
    retry_after_jitter: float = Field(default=0.5, ge=0, le=10)

    quota_window_s: float = Field(default=60.0, gt=0)
    quota_skew_s: float = Field(default=0.25, ge=0)
    quota_lease_s: float = Field(default=30.0, gt=0)
    quota_wait_grace_s: float = Field(default=5.0, gt=0)

    # Calls one gateway process holds in flight (Celery thread-pool size).
    gateway_concurrency: int = Field(default=500, ge=1, le=5000)

    @classmethod
    def load(cls) -> GatewaySettings:
        return load_settings(cls)

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.retry_max_attempts,
            base_delay_s=self.retry_base_delay_s,
            max_delay_s=self.retry_max_delay_s,
            retry_after_cap_s=self.retry_after_cap_s,
            retry_after_jitter=self.retry_after_jitter,
        )

    def quota_config(self) -> QuotaConfig:
        return QuotaConfig(
            window_s=self.quota_window_s,
            skew_s=self.quota_skew_s,
            lease_s=self.quota_lease_s,
            wait_grace_s=self.quota_wait_grace_s,
        )
