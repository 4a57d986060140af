"""The one retry policy for provider calls: what to retry, how long to wait.

Client libraries' own retries are off (httpx never retries; adapters make one HTTP call per
method call), so every retry happens here and is recorded as an attempt. Retried: 408, 409,
429, 5xx, timeouts, broken connections and cut streams (the exception's ``retryable``). Not
retried: other 4xx, auth failures, exhausted account quota. The provider's own wait
(``retry-after-ms``, ``Retry-After``, Google's RetryInfo) is honoured up to a cap; otherwise
exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And Jitter"),
which spreads retries of many callers so they do not hit a recovering provider in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from conductor.errors import WorkerError


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4  # per worker, first try included
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    retry_after_cap_s: float = 60.0  # a provider asking for longer is treated as down
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if min(self.base_delay_s, self.max_delay_s, self.retry_after_cap_s) < 0:
            raise ValueError("retry delays must not be negative")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether the call that just failed on ``attempt`` (1-based) gets another try."""
        if attempt >= self.max_attempts or not isinstance(error, WorkerError):
            return False
        if not error.retryable:
            return False
        wait = error.retry_after_s
        # A provider that asks for a wait beyond the cap is not coming back soon: fall back.
        return wait is None or wait <= self.retry_after_cap_s

    def delay_s(self, error: BaseException, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        wait = error.retry_after_s if isinstance(error, WorkerError) else None
        if wait is not None:
            return min(wait, self.retry_after_cap_s)
        # The exponent is capped: 2 ** 1025 is too large a float, and the ceiling is reached long
        # before anyway.
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt - 1, 64))
        return self.rng.uniform(0, ceiling)
