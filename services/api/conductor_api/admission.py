"""The headers that tell an HTTP client where its API key stands (its limits, as the
service's admission saw them), on the answer whatever it is."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_STATE_KEY = "limit_headers"


def keep_limit_headers(request: Request, headers: dict[str, str]) -> None:
    """Keep ``headers`` (``WorkflowService.admit``'s) in the request's state for LimitHeaders
    to send."""
    if headers:
        state: dict[str, object] = request.scope.setdefault("state", {})
        state[_STATE_KEY] = headers


class LimitHeaders:
    """Adds the headers kept to the response (plain ASGI, as MetricsMiddleware)."""

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
