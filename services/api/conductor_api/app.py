"""The HTTP application: routes, errors, limits, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import conductor
from conductor.orchestration import text_fault
from conductor_adapters.telemetry import instrument_app
from conductor_api import chat, jobs, responses, stats, ui, unsupported_endpoints
from conductor_api.admission import LimitHeaders
from conductor_api.errors import (
    ApiError,
    error_body,
    error_response,
    install_error_handlers,
    invalid,
)
from conductor_api.hosts import HostCheck
from conductor_api.metrics import MetricsMiddleware
from conductor_api.schemas import ErrorResponse
from conductor_api.service import WorkflowService

MAX_BODY_BYTES = 2 * 1024 * 1024
# How long the body of a request may stall (no byte arriving) before it is refused with 408:
# a client that stops mid-upload would otherwise hold the connection, and a worker's memory,
# for as long as it likes. Generous: a 2 MiB body on a slow link arrives in far less.
BODY_STALL_S = 30.0


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with a 413, declared or streamed, and bodies
    that stall for ``stall_s`` seconds with a 408.

    A streamed body is counted as the app reads it; past the limit (or the stall) the read
    fails, and whatever the app answers to that (FastAPI: a 400 "error parsing the body") is
    replaced by the refusal. Once the body is complete, reads are left alone: a streaming
    response waits on them for the client's disconnect, for as long as it streams.
    """

    def __init__(
        self, app: ASGIApp, limit: int = MAX_BODY_BYTES, stall_s: float | None = None
    ) -> None:
        self.app = app
        self.limit = limit
        self.stall_s = BODY_STALL_S if stall_s is None else stall_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _refuse(send, 413, f"request body over {self.limit} bytes", "request_too_large")
            return
        received = 0
        body_done = False
        refusal: tuple[int, str, str] | None = None
        replied = False

        async def counted() -> Message:
            nonlocal received, body_done, refusal
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout(self.stall_s):  # no task of its own, unlike wait_for
                    message = await receive()
            except TimeoutError:
                refusal = (
                    408,
                    f"the request body stalled: no byte in {self.stall_s:g} s",
                    "request_timeout",
                )
                raise _Refused from None
            if message["type"] == "http.request":
                body_done = not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > self.limit:
                    refusal = (413, f"request body over {self.limit} bytes", "request_too_large")
                    raise _Refused
            else:
                body_done = True  # a disconnect: nothing more will arrive
            return message

        async def guarded(message: Message) -> None:
            nonlocal replied
            if refusal is not None:
                if not replied:
                    replied = True
                    await _refuse(send, *refusal)
                return
            replied = True
            await send(message)

        with contextlib.suppress(_Refused):
            await self.app(scope, counted, guarded)
        if refusal is not None and not replied:
            await _refuse(send, *refusal)


async def _refuse(send: Send, status: int, message: str, code: str) -> None:
    # Connection: close: what is left of the body must not be read as the next request.
    response = JSONResponse(
        error_body(status, message, code=code), status_code=status, headers={"connection": "close"}
    )
    await response({"type": "http"}, _no_body, send)


class QueryText:
    """Refuses a query parameter whose value is not UTF-8 or holds what ``text_fault`` finds,
    with a 400 naming it, before any route reads it: Starlette would decode bad bytes to
    replacement characters (a filter then matches nothing, silently), and a NUL reaches
    PostgreSQL as a bound value (a 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = query_fault(scope.get("query_string", b"")) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await error_response(refusal)(scope, receive, send)


def query_fault(query: bytes) -> ApiError | None:
    """The refusal for the first bad value in a raw query string, if any."""
    for part in query.split(b"&"):
        raw_name, _, raw_value = part.partition(b"=")
        name = urllib.parse.unquote_plus(raw_name.decode("latin-1"), errors="replace")
        try:
            value = urllib.parse.unquote_to_bytes(raw_value.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            return invalid(name, "must be UTF-8 (an overlong form, an encoded surrogate?)")
        fault = text_fault(value)
        if fault is not None:
            return invalid(name, f"must not contain {fault}")
    return None


class _Refused(Exception):
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


METRICS_ELSEWHERE = (
    "/metrics shows every tenant's usage, so with API keys it is served on the metrics port "
    "only: set CONDUCTOR_METRICS_PORT and scrape that port"
)


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
        # No /docs or /redoc: their pages load scripts from a CDN (no CSP can vouch for them,
        # and offline they are blank). /openapi.json stays, for any viewer or generator.
        docs_url=None,
        redoc_url=None,
        description=(
            "OpenAI-compatible chat completions answered by Conductor workflows, the job API "
            "for workflows, and operations endpoints. Authenticate with "
            "`Authorization: Bearer <key>`."
        ),
    )
    app.state.service = service  # routes read it with conductor_api.auth.service_of
    app.state.open_access = open_access
    metrics = service.metrics
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(jobs.router)
    app.include_router(responses.router)
    app.include_router(stats.router)
    app.include_router(ui.router)
    app.include_router(unsupported_endpoints.router)

    app.add_middleware(LimitHeaders)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.get("/healthz", tags=["Operations"])
    async def healthz() -> dict[str, str]:
        """The process answers (liveness)."""
        return {"status": "ok"}

    ready_body = {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}}

    @app.get(
        "/readyz",
        tags=["Operations"],
        response_class=JSONResponse,
        responses={
            200: {"description": "Ready", "content": ready_body},
            503: {"description": "Not ready", "content": ready_body},
        },
    )
    async def readyz() -> JSONResponse:
        """Database, broker and Redis (distributed; the planner is reported, not required) or
        database and workers (embedded)."""
        ready, body = await service.readiness()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get(
        "/metrics",
        tags=["Operations"],
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
            403: {
                "description": "API keys exist: scrape the metrics port instead",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
                },
            },
        },
    )
    async def prometheus() -> Response:
        """Prometheus text format, here only while the server is open (no API key exists).
        The metrics name every tenant, key and worker, so once keys exist they are served on
        the metrics port (CONDUCTOR_METRICS_PORT) alone, which ops expose to Prometheus only."""
        if open_access and not await service.keys.any_key_exists():
            return metrics.exposition()
        raise ApiError(403, METRICS_ELSEWHERE, code="metrics_on_metrics_port")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    # One span per request (the client's traceparent its parent), when tracing is on.
    instrument_app(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(QueryText)
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
