"""The one retry policy for provider calls: what to retry, how long to wait.

Client libraries' own retries are off (httpx never retries; adapters make one HTTP call per
method call), so every retry happens here and is recorded as an attempt. Retried: 408, 409,
429, 5xx, timeouts, broken connections and cut streams (the exception's ``retryable``). Not
retried: other 4xx, auth failures, exhausted account quota. The provider's own wait
(``retry-after-ms``, ``Retry-After``, Google's RetryInfo) is honoured up to a cap, plus a
random extra of up to ``retry_after_jitter`` times that wait (of 0.1 s when shorter): every
caller told "1 s" at once otherwise came back in the same instant, in waves. Never less than
the wait asked for. Without a wait: exponential backoff with full jitter (AWS architecture
blog, "Exponential Backoff And Jitter"). Both spread the retries of many callers so they do not
hit a recovering provider in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from conductor.errors import WorkerError

JITTER_FLOOR_S = 0.1


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4  # per worker, first try included
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    retry_after_cap_s: float = 60.0  # a provider asking for longer is treated as down
    # The most added to a provider's wait, as a fraction of that wait (of JITTER_FLOOR_S when
    # the wait is shorter: a "Retry-After: 0" storm is spread too), and at most max_delay_s.
    retry_after_jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        delays = (self.base_delay_s, self.max_delay_s, self.retry_after_cap_s)
        if min(*delays, self.retry_after_jitter) < 0:
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
            wait = min(wait, self.retry_after_cap_s)
            return wait + self.rng.uniform(0, self.retry_after_spread_s(wait))
        # The exponent is capped: 2 ** 1025 is too large a float, and the ceiling is reached long
        # before anyway.
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt - 1, 64))
        return self.rng.uniform(0, ceiling)

    def retry_after_spread_s(self, wait_s: float) -> float:
        """The most a provider's wait of ``wait_s`` is lengthened by."""
        return min(self.max_delay_s, self.retry_after_jitter * max(wait_s, JITTER_FLOOR_S))
