"""The gateway's one retry policy: what is retried, how often, and how long it waits."""

from __future__ import annotations

import random

import pytest

from conductor.errors import (
    MalformedResponse,
    ProviderAuthError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    QuotaExhausted,
    RateLimited,
    StreamInterrupted,
    WorkerError,
    WorkerUnavailable,
)
from conductor_gateway.retry import RetryPolicy

RETRYABLE: list[WorkerError] = [
    RateLimited("slow down"),
    ProviderUnavailable("502 bad gateway", status_code=502),
    ProviderUnavailable("408 request timeout", status_code=408),
    ProviderTimeout("no answer in 30 s"),
    StreamInterrupted("stream ended before [DONE]"),
    MalformedResponse("body is not JSON", status_code=200),
]
NOT_RETRYABLE: list[WorkerError] = [
    ProviderRejected("400 bad request", status_code=400),
    ProviderAuthError("401 invalid api key", status_code=401),
    QuotaExhausted("429 insufficient_quota", status_code=429),
    WorkerUnavailable("no API key configured"),
    WorkerError("a failure of no particular kind"),
]


def _name(error: BaseException) -> str:
    return type(error).__name__


@pytest.mark.parametrize("error", RETRYABLE, ids=_name)
def test_retryable_errors_are_retried_until_max_attempts(error: WorkerError) -> None:
    # Given a policy of 4 attempts
    policy = RetryPolicy(max_attempts=4, rng=random.Random(1))

    # When a retryable error ends attempts 1..4
    decisions = [policy.should_retry(error, attempt) for attempt in range(1, 5)]

    # Then attempts 1-3 get another try, the 4th (the last allowed) does not
    assert decisions == [True, True, True, False]
    assert not policy.should_retry(error, 5)


def test_a_single_attempt_policy_never_retries() -> None:
    policy = RetryPolicy(max_attempts=1)

    assert not policy.should_retry(RateLimited("slow down"), 1)


@pytest.mark.parametrize("error", NOT_RETRYABLE, ids=_name)
def test_errors_that_a_retry_cannot_fix_are_never_retried(error: WorkerError) -> None:
    policy = RetryPolicy(max_attempts=10)

    assert not error.retryable
    assert not any(policy.should_retry(error, attempt) for attempt in range(1, 10))


def test_a_rejection_is_not_retried_even_when_it_names_a_wait() -> None:
    policy = RetryPolicy(max_attempts=5)
    error = ProviderRejected("400 bad request", status_code=400, retry_after_s=1.0)

    assert not policy.should_retry(error, 1)


@pytest.mark.parametrize(
    "error",
    [ValueError("bug in an adapter"), TimeoutError("socket"), ConnectionError("reset")],
    ids=_name,
)
def test_exceptions_that_are_not_worker_errors_are_never_retried(error: Exception) -> None:
    policy = RetryPolicy(max_attempts=10)

    assert not any(policy.should_retry(error, attempt) for attempt in range(1, 10))


@pytest.mark.parametrize("retry_after_s", [0.0, 0.25, 7.5, 30.0])
def test_retry_after_is_honoured_and_never_undercut(retry_after_s: float) -> None:
    # Given a provider that asked for a wait within the cap
    policy = RetryPolicy(max_attempts=4, retry_after_cap_s=30.0, rng=random.Random(7))
    error = RateLimited("slow down", retry_after_s=retry_after_s)

    # When the delay is drawn many times, whatever the attempt
    assert policy.should_retry(error, 1)
    delays = [policy.delay_s(error, attempt) for attempt in (1, 2, 3) for _ in range(300)]

    # Then no retry comes before the wait asked for, nor later than the bounded jitter allows
    spread = policy.retry_after_spread_s(retry_after_s)
    assert spread == min(20.0, 0.5 * max(retry_after_s, 0.1))
    assert all(retry_after_s <= d <= retry_after_s + spread for d in delays)


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_callers_told_the_same_retry_after_spread_out_rather_than_come_back_in_a_wave(
    seed: int,
) -> None:
    """Issue 36: 1,000 callers rate-limited in the same instant with "Retry-After: 1" all came
    back exactly 1 s later. Now their retries spread over the half second after it."""
    policy = RetryPolicy(rng=random.Random(seed))  # the default jitter: up to half the wait
    error = RateLimited("slow down", retry_after_s=1.0)

    delays = [policy.delay_s(error, 1) for _ in range(1000)]

    assert min(delays) >= 1.0
    assert max(delays) <= 1.5
    # spread over the whole window: no tenth of it gets more than a fifth of the callers
    buckets = [0] * 10
    for delay in delays:
        buckets[min(9, int((delay - 1.0) / 0.05))] += 1
    assert max(buckets) < 200, buckets
    assert min(buckets) > 50, buckets
    assert len(set(delays)) == len(delays)


def test_retry_after_jitter_can_be_turned_off() -> None:
    policy = RetryPolicy(retry_after_jitter=0.0)
    error = RateLimited("slow down", retry_after_s=2.0)

    assert {policy.delay_s(error, 1) for _ in range(50)} == {2.0}


def test_retry_after_on_a_503_is_honoured_too() -> None:
    policy = RetryPolicy(max_attempts=3, retry_after_cap_s=60.0)
    error = ProviderUnavailable("503 overloaded", status_code=503, retry_after_s=12.0)

    assert policy.should_retry(error, 1)
    # 12 s asked for: at most the max delay (20 s) or half the wait (6 s) is added
    assert 12.0 <= policy.delay_s(error, 1) <= 18.0


def test_a_retry_after_beyond_the_cap_falls_back_instead_of_waiting() -> None:
    # Given a cap of 10 s and a provider asking for 11 s
    policy = RetryPolicy(max_attempts=4, retry_after_cap_s=10.0, retry_after_jitter=0.0)
    error = RateLimited("come back later", retry_after_s=11.0)

    # Then the call is not retried (the caller falls back), and any wait is capped
    assert not policy.should_retry(error, 1)
    assert policy.delay_s(error, 1) == 10.0
    # while a wait of exactly the cap is still honoured
    at_cap = RateLimited("come back later", retry_after_s=10.0)
    assert policy.should_retry(at_cap, 1)
    assert policy.delay_s(at_cap, 1) == 10.0


@pytest.mark.parametrize("seed", [0, 1, 42, 2024])
def test_backoff_is_full_jitter_under_a_growing_ceiling(seed: int) -> None:
    # Given a policy with base 0.5 s, max 3 s and a seeded random source
    base_s, max_s = 0.5, 3.0
    policy = RetryPolicy(
        max_attempts=10, base_delay_s=base_s, max_delay_s=max_s, rng=random.Random(seed)
    )
    error = ProviderUnavailable("502", status_code=502)  # no Retry-After: backoff applies

    # When the delay after each of attempts 1..6 is drawn 200 times
    delays = {
        attempt: [policy.delay_s(error, attempt) for _ in range(200)] for attempt in range(1, 7)
    }

    # Then every delay lies in [0, min(max, base * 2**(attempt - 1))]
    ceilings = {attempt: min(max_s, base_s * 2 ** (attempt - 1)) for attempt in delays}
    assert ceilings == {1: 0.5, 2: 1.0, 3: 2.0, 4: 3.0, 5: 3.0, 6: 3.0}
    for attempt, drawn in delays.items():
        assert all(0 <= d <= ceilings[attempt] for d in drawn), attempt
    # and the jitter is full: draws spread over the whole range, low and high
    for attempt, drawn in delays.items():
        assert min(drawn) < 0.1 * ceilings[attempt], attempt
        assert max(drawn) > 0.9 * ceilings[attempt], attempt
    # so the ceiling grows until max_delay_s: later attempts wait longer than earlier ones can
    assert max(delays[2]) > ceilings[1]
    assert max(delays[3]) > ceilings[2]
    assert max(delays[4]) > ceilings[3]


def test_backoff_draws_from_the_given_random_source() -> None:
    error = ProviderTimeout("no answer")

    def draws(seed: int) -> list[float]:
        policy = RetryPolicy(max_attempts=6, rng=random.Random(seed))
        return [policy.delay_s(error, attempt) for attempt in range(1, 6)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_backoff_for_exceptions_that_are_not_worker_errors() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=4.0, rng=random.Random(5))

    delays = [policy.delay_s(OSError("reset"), 3) for _ in range(100)]

    assert all(0 <= d <= 4.0 for d in delays)


def test_backoff_stays_under_max_delay_for_very_late_attempts() -> None:
    # Given a policy allowing many attempts (nothing bounds max_attempts)
    policy = RetryPolicy(max_attempts=5000, base_delay_s=0.5, max_delay_s=20.0)
    error = ProviderUnavailable("502", status_code=502)

    # When the delay after attempt 1100 is asked for (2**1099 overflows a float)
    delay = policy.delay_s(error, 1100)

    # Then it is still a delay within max_delay_s
    assert 0 <= delay <= 20.0


@pytest.mark.parametrize(
    "fields",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"base_delay_s": -0.1},
        {"max_delay_s": -1.0},
        {"retry_after_cap_s": -5.0},
        {"retry_after_jitter": -0.5},
    ],
    ids=lambda fields: next(iter(fields)) + "=" + str(next(iter(fields.values()))),
)
def test_invalid_settings_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        RetryPolicy(**fields)  # type: ignore[arg-type]


def test_the_defaults_are_valid_and_zero_delays_are_allowed() -> None:
    default = RetryPolicy()
    assert default.max_attempts >= 1
    no_wait = RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0, retry_after_cap_s=0.0)

    assert no_wait.delay_s(ProviderTimeout("x"), 1) == 0.0
