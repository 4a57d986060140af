"""Errors users can act on. Each carries a message that says what to do."""


class ConductorError(Exception):
    """Base class of the errors this project raises on purpose."""


class ConfigurationError(ConductorError):
    """Settings, pool file or profile are wrong; the message names the fix."""


class InvalidRequest(ConductorError, ValueError):
    """The request itself is unacceptable (empty question, too long, unknown option)."""


class ModelNotFoundError(ConfigurationError):
    """A model file or package the configuration needs is not installed."""


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
