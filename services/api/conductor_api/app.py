"""The HTTP application: routes, errors, limits, health, readiness and metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import conductor
from conductor_api import chat, jobs, responses, stats, ui
from conductor_api.admission import LimitHeaders
from conductor_api.errors import error_body, install_error_handlers
from conductor_api.hosts import HostCheck
from conductor_api.metrics import ApiMetrics, MetricsMiddleware
from conductor_api.schemas import ErrorResponse
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


_ERRORS = {
    "400": "Invalid request: the message names the field",
    "401": "Missing, wrong or revoked API key",
    "404": "Unknown model, or a workflow this key cannot see",
    "413": "Request body over 2 MiB",
}


def _openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, corrected to what the API does: errors are OpenAI error objects
    with status 400 (never FastAPI's 422), and /v1 needs a bearer key."""
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    error_schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorResponse"] = error_schema
    schemas["Readiness"] = {
        "type": "object",
        "description": "status (ready or not ready), mode, and each check: ok or what is wrong",
        "properties": {"status": {"type": "string"}, "mode": {"type": "string"}},
        "required": ["status", "mode"],
        "additionalProperties": {"type": "string"},
    }
    document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path, operations in document["paths"].items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            if not path.startswith("/v1/"):
                continue
            operation["security"] = [{"bearer": []}]
            for status, description in _ERRORS.items():
                responses.setdefault(status, {"description": description, "content": ref})
    return document


def create_app(
    service: WorkflowService,
    *,
    open_access: bool = False,
    cors_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
) -> FastAPI:
    """The API over ``service``; ``open_access`` (embedded only) admits requests without a
    key while no key exists, from loopback ``Host`` names and ``allowed_hosts`` only."""
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
    app.include_router(responses.router)
    app.include_router(stats.router)
    app.include_router(ui.router)

    app.add_middleware(LimitHeaders)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.get("/healthz", tags=["Operations"])
    async def healthz() -> dict[str, str]:
        """The process answers (liveness)."""
        return {"status": "ok"}

    readiness = {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}}

    @app.get(
        "/readyz",
        tags=["Operations"],
        response_class=JSONResponse,
        responses={
            200: {"description": "Ready", "content": readiness},
            503: {"description": "Not ready", "content": readiness},
        },
    )
    async def readyz() -> JSONResponse:
        """Database, broker and Redis (distributed; the planner is reported, not required) or
        database and workers (embedded)."""
        checks = await service.readiness()
        ready = all(
            value == "ok" for name, value in checks.items() if name not in service.advisory_checks
        )
        body = {"status": "ready" if ready else "not ready", "mode": service.mode, **checks}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get(
        "/metrics",
        tags=["Operations"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus() -> Response:
        """Prometheus text format."""
        return metrics.exposition()

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodyLimit)
    app.add_middleware(
        HostCheck, service=service, open_access=open_access, allowed_hosts=allowed_hosts
    )
    if cors_origins:
        # Outermost, so refusals (401, 413) carry the headers a browser needs to read them.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "OpenAI-Beta"],
            expose_headers=["x-should-retry", "Retry-After"],
            max_age=600,
        )
    return app
