"""Whether a caller's request may start work now (its API key's limits), and the headers that
tell the client where its key stands, on the answer whatever it is."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conductor_api.errors import ApiError
from conductor_api.metrics import ApiMetrics
from conductor_api.service import Caller, WorkflowService

BUDGET_HEADER = "x-conductor-budget-remaining-usd"
_STATE_KEY = "limit_headers"


async def admit(
    service: WorkflowService,
    metrics: ApiMetrics,
    caller: Caller,
    *,
    starts_workflow: bool,
    state: dict[str, object] | None = None,
) -> None:
    """Raise ApiError 429 when the caller's key is at a limit; otherwise keep the key's
    standing in ``state`` (a request's ``scope["state"]``) for LimitHeaders to send."""
    try:
        headers = await service.limiter.admit(
            caller.key_id, caller.limits, starts_workflow=starts_workflow
        )
    except ApiError as refused:
        metrics.refused.labels(refused.code or "limit").inc()
        _budget_seen(metrics, caller, refused.headers)
        raise
    _budget_seen(metrics, caller, headers)
    if state is not None:
        state[_STATE_KEY] = headers


def request_state(request: Request) -> dict[str, object]:
    """The request's state (its scope's), where ``admit`` keeps the headers."""
    state: dict[str, object] = request.scope.setdefault("state", {})
    return state


def _budget_seen(metrics: ApiMetrics, caller: Caller, headers: dict[str, str]) -> None:
    if caller.key_id is not None and BUDGET_HEADER in headers:
        metrics.budget_remaining.labels(caller.key_id).set(float(headers[BUDGET_HEADER]))


class LimitHeaders:
    """Adds the headers ``admit`` kept to the response (plain ASGI, as MetricsMiddleware)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = scope.get("state", {}).get(_STATE_KEY)
                if kept:
                    message["headers"] = [
                        *message.get("headers", []),
                        *((k.encode(), v.encode()) for k, v in kept.items()),
                    ]
            await send(message)

        await self.app(scope, receive, with_headers)
