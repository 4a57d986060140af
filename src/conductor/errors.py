"""Every error this project raises on purpose, in one tree. Each message says what to do.

ConductorError
├── ConfigurationError            settings, pool file or variants are wrong
│   └── ModelNotFoundError        a model file or package is not installed
├── InvalidRequest                the request itself is unacceptable (also a ValueError)
├── DatabaseUnavailableError      the trace database did not answer in time at start-up
├── ProcessStartError             a process of the local stack did not start
├── PlannerError                  a Conductor (planner) call failed; ``retryable`` says if a
│   ├── PlannerUnavailable            later call may succeed
│   ├── PlannerTimeout
│   ├── PlannerRejected
│   └── PlannerCallFailed
├── WorkerError                   one provider call failed (the gateway's retry policy keys
│   ├── ProviderRejected              on the class and on ``retryable``)
│   │   ├── ProviderAuthError
│   │   └── QuotaExhausted
│   ├── RateLimited
│   ├── ProviderUnavailable
│   │   └── StreamInterrupted
│   ├── ProviderTimeout
│   ├── MalformedResponse
│   └── WorkerUnavailable
└── StepCallFailed                every attempt of a step, fallbacks included, failed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

    from conductor.workflow import AttemptRecord


class ConductorError(Exception):
    """Base class of the errors this project raises on purpose."""


class ConfigurationError(ConductorError):
    """Settings, pool file or variant are wrong; the message names the fix."""


class InvalidRequest(ConductorError, ValueError):
    """The request itself is unacceptable (empty question, too long, unknown option);
    ``param`` names the request's field at fault, where one is."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFoundError(ConfigurationError):
    """A model file or package the configuration needs is not installed."""


class DatabaseUnavailableError(ConductorError):
    """The database could not be reached within the start-up timeout."""


class ProcessStartError(ConductorError):
    """A process of the local stack did not start; the message carries the end of its log."""

    # Whether a port it was to listen on was taken (by another process, since it was chosen).
    port_taken: bool = False


class PlannerError(ConductorError):
    """A call to the Conductor planner failed. Not a WorkerError: the gateway's retries and
    fallbacks are for worker calls; a failed planning round is retried by its driver."""

    retryable: bool = False


class PlannerUnavailable(PlannerError):
    """The planner could not be reached, or is loading, draining or overloaded."""

    retryable = True


class PlannerTimeout(PlannerError):
    """The planner did not answer within the call's deadline."""

    retryable = True


class PlannerRejected(PlannerError):
    """The planner refused the request as invalid; sending it again will not help."""


class PlannerCallFailed(PlannerError):
    """The planner failed otherwise (an internal error, or an answer that does not parse)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class WorkerError(ConductorError):
    """A worker call failed. Subclasses say how (the gateway's retry policy keys on them)."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        # What the provider asked us to wait (Retry-After, retry-after-ms, Gemini's RetryInfo),
        # on a 429 and on a 503 alike; None when it said nothing.
        self.retry_after_s = retry_after_s


class ProviderRejected(WorkerError):
    """The provider refused the request (4xx other than 408/409/429); retrying will not help."""


class ProviderAuthError(ProviderRejected):
    """401/403: the API key is missing, wrong or lacks permission."""


class QuotaExhausted(ProviderRejected):
    """429 ``insufficient_quota``: the account is out of credit; waiting will not help."""


class RateLimited(WorkerError):
    retryable = True

    def __init__(
        self, message: str, *, status_code: int | None = 429, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, status_code=status_code, retry_after_s=retry_after_s)


class ProviderUnavailable(WorkerError):
    """5xx, 408, 409 or a broken connection: the provider may answer on a later try."""

    retryable = True


class StreamInterrupted(ProviderUnavailable):
    """A streamed answer stopped before its end marker: the text so far is not the answer."""


class ProviderTimeout(WorkerError):
    retryable = True


class MalformedResponse(WorkerError):
    """The provider answered 2xx with a body that does not match its wire format."""

    retryable = True


class WorkerUnavailable(WorkerError):
    """The worker is in the pool file but cannot be called here (no key, no adapter yet)."""


class StepCallFailed(ConductorError):
    """Every attempt of a step's call, fallbacks included, failed; ``attempts`` says how."""

    def __init__(self, message: str, attempts: list[AttemptRecord]) -> None:
        super().__init__(message)
        self.attempts = attempts


def validation_problems(exc: ValidationError, *, whole: str = "", plain: bool = False) -> str:
    """A pydantic error as one line, ``field.path: message; ...``. ``whole`` names a problem of
    no one field (a check of the whole model); ``plain`` drops the "Value error, " pydantic puts
    before the messages of this project's own validators."""
    problems = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ") if plain else error["msg"]
        problems.append(f"{'.'.join(str(part) for part in error['loc']) or whole}: {message}")
    return "; ".join(problems)
