"""The HTTP application: routes, errors, limits, health, readiness and metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import conductor
from conductor_api import chat, jobs
from conductor_api.errors import error_body, install_error_handlers
from conductor_api.metrics import ApiMetrics
from conductor_api.service import WorkflowService

MAX_BODY_BYTES = 2 * 1024 * 1024


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with a 413, declared or streamed.

    A streamed body is counted as the app reads it; past the limit the read fails, and
    whatever the app answers to that (FastAPI: a 400 "error parsing the body") is replaced by
    the 413.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        received = 0
        exceeded = replied = False

        async def counted() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    exceeded = True
                    raise _TooLarge
            return message

        async def guarded(message: Message) -> None:
            nonlocal replied
            if exceeded:
                if not replied:
                    replied = True
                    await self._refuse(send)
                return
            replied = True
            await send(message)

        with contextlib.suppress(_TooLarge):
            await self.app(scope, counted, guarded)
        if exceeded and not replied:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        message = f"request body over {self.limit} bytes"
        response = JSONResponse(error_body(413, message, code="request_too_large"), status_code=413)
        await response({"type": "http"}, _no_body, send)


class _TooLarge(Exception):
    pass


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def create_app(service: WorkflowService, *, open_access: bool = False) -> FastAPI:
    """The API over ``service``; ``open_access`` (embedded only) admits requests without a
    key while no key exists."""
    app = FastAPI(
        title="Conductor API",
        version=conductor.__version__,
        description=(
            "OpenAI-compatible chat completions answered by Conductor workflows, the job API "
            "for workflows, and operations endpoints. Authenticate with "
            "`Authorization: Bearer <key>`."
        ),
    )
    app.state.service = service
    app.state.open_access = open_access
    metrics = ApiMetrics()
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(jobs.router)

    @app.middleware("http")
    async def count(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Any:
        return await metrics.middleware(request, call_next)

    @app.get("/healthz", tags=["Operations"])
    async def healthz() -> dict[str, str]:
        """The process answers (liveness)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["Operations"], responses={503: {"description": "Not ready"}})
    async def readyz() -> JSONResponse:
        """Database, broker and planner (distributed) or database and workers (embedded)."""
        checks = await service.readiness()
        ready = all(v == "ok" for v in checks.values())
        body = {"status": "ready" if ready else "not ready", "mode": service.mode, **checks}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["Operations"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus text format."""
        return metrics.exposition()

    app.add_middleware(BodyLimit)
    return app
