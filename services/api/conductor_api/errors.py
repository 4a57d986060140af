"""Errors as OpenAI error objects: ``{"error": {"message", "type", "param", "code"}}``.

The official SDKs turn the status code into their exception classes (400 BadRequestError,
401 AuthenticationError, 404 NotFoundError, ...) and show ``message``; so every refusal says
what was wrong and how to fix it, and nothing internal (or secret) leaks into it.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from conductor.errors import DatabaseUnavailableError, InvalidRequest

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(Exception):
    """A refusal with its HTTP status; raised anywhere below a route. ``retry`` False tells
    the OpenAI SDKs (``x-should-retry: false``) that sending it again would only repeat it:
    a workflow that failed or ran out of time would run, and cost, again."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry: bool | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry = retry
        self.headers = headers or {}


def invalid(param: str, reason: str) -> ApiError:
    """A 400 for a value that is wrong, naming the field that holds it."""
    return ApiError(400, f"{param}: {reason}", param=param)


def unsupported(param: str, reason: str) -> ApiError:
    """A 400 for what this API cannot do, naming the field that asks for it."""
    return ApiError(400, f"{param}: {reason}", code="unsupported_parameter", param=param)


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what} not found", code="not_found")


def runs_elsewhere(workflow_id: object) -> ApiError:
    return ApiError(
        409,
        f"workflow {workflow_id} runs in another conductor serve process on this database; "
        "cancel it through that one",
        code="runs_elsewhere",
    )


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
    headers.update(error.headers)
    if error.retry is not None:
        headers["x-should-retry"] = "true" if error.retry else "false"
    body = error_body(error.status, error.message, code=error.code, param=error.param)
    return JSONResponse(body, status_code=error.status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first: dict[str, Any] = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    message = str(first.get("msg", "invalid request"))
    return (f"{param}: {message}" if param else message), param


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidRequest)
        return error_response(ApiError(400, str(exc), param=exc.param))

    async def database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        logger.error("%s", exc)
        message = "the trace database is unavailable; nothing was started, try again later"
        return error_response(ApiError(503, message, code="database_unavailable"))

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in content_type:
            # curl -d sends a form's content type: the body was never read as JSON.
            message = (
                "send the body as JSON with the header Content-Type: application/json "
                f"(this request's content type: {content_type or 'none'})"
            )
            return error_response(ApiError(400, message, code="unsupported_content_type"))
        message, param = _validation_message(exc)
        return error_response(ApiError(400, message, param=param))

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(ApiError(exc.status_code, str(exc.detail), code=code))

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        # Not retried by the SDKs: what failed may have started work a retry would repeat.
        message = "internal error; the server log has the details"
        return error_response(ApiError(500, message, retry=False))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(InvalidRequest, invalid)
    app.add_exception_handler(DatabaseUnavailableError, database_unavailable)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
