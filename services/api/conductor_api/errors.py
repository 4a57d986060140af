"""Errors as OpenAI error objects: ``{"error": {"message", "type", "param", "code"}}``.

The official SDKs turn the status code into their exception classes (400 BadRequestError,
401 AuthenticationError, 404 NotFoundError, ...) and show ``message``; so every refusal says
what was wrong and how to fix it, and nothing internal (or secret) leaks into it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from conductor.errors import DatabaseUnavailableError, InvalidRequest
from conductor_adapters.store.db import database_down

logger = logging.getLogger(__name__)

# What surrogateescape makes of bytes that are not UTF-8.
_ESCAPED = re.compile("[\udc80-\udcff]")

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


def unknown_model(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model {model!r} does not exist or you do not have access to it "
        "(GET /v1/models lists yours).",
        code="model_not_found",
        param="model",
    )


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what} not found", code="not_found")


def runs_elsewhere(workflow_id: object) -> ApiError:
    return ApiError(
        409,
        f"workflow {workflow_id} runs in another conductor serve process on this database; "
        "cancel it through that one",
        code="runs_elsewhere",
    )


def _printable(text: str) -> str:
    # A refusal may quote what the client sent (pydantic's "Input tag '...'"), and a lone
    # surrogate in it has no UTF-8 form: the JSON answer would fail to encode, as a 500.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if param is not None:
        param = _printable(param)
    return {"error": {"message": _printable(message), "type": kind, "param": param, "code": code}}


def _undecodable(body: bytes) -> ApiError:
    """The 400 for a JSON body that is not UTF-8, naming the first field (or map) whose text
    holds the bytes at fault: read with surrogateescape, they are the only lone surrogates."""
    kinds = "an overlong form, an encoded surrogate, a stray byte"
    try:
        document = json.loads(body.decode("utf-8", "surrogateescape"))
    except ValueError:
        document = None
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:
        path, value = pending.pop(0)
        if isinstance(value, str) and _ESCAPED.search(value):
            message = f"{path}: must not contain bytes that are not UTF-8 ({kinds})"
            return ApiError(400, message, param=path or None)
        if isinstance(value, dict):
            for key, item in value.items():
                if _ESCAPED.search(key):
                    message = f"{path or 'the body'}: a key is not UTF-8 ({kinds})"
                    return ApiError(400, message, param=path or None)
                pending.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            pending.extend((f"{path}.{i}", item) for i, item in enumerate(value))
    return ApiError(400, f"the request body is not UTF-8 ({kinds})")


def error_response(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
    headers.update(error.headers)
    if error.retry is not None:
        headers["x-should-retry"] = "true" if error.retry else "false"
    body = error_body(error.status, error.message, code=error.code, param=error.param)
    return JSONResponse(body, status_code=error.status, headers=headers)


def _field(error: dict[str, Any]) -> str:
    return ".".join(
        str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "header")
    )


def unknown_fields(names: list[str]) -> ApiError:
    """The 400 for fields the API does not know, naming every one (``param``: the first), as
    every door answers it: nothing a client asks for is dropped without a word."""
    listed = ", ".join(names)
    message = f"{listed}: unknown parameter{'s' if len(names) > 1 else ''}"
    return ApiError(400, message, code="unknown_parameter", param=names[0])


def _unknown(exc: RequestValidationError) -> ApiError | None:
    """Fields a request model forbids (``extra="forbid"``): a 400 naming them all."""
    names = [_field(e) for e in exc.errors() if e.get("type") == "extra_forbidden"]
    return unknown_fields(names) if names else None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first: dict[str, Any] = exc.errors()[0] if exc.errors() else {}
    param = _field(first) or None
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    message = str(first.get("msg", "invalid request"))
    return (f"{param}: {message}" if param else message), param


DATABASE_RETRY_AFTER_S = 5


def database_unavailable_error() -> ApiError:
    """The 503 for a request the database could not serve, whichever runtime (SDKs retry a
    503, after Retry-After)."""
    message = "the trace database is unavailable; nothing was started, try again later"
    headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)}
    return ApiError(503, message, code="database_unavailable", headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidRequest)
        return error_response(ApiError(400, str(exc), param=exc.param))

    async def database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        logger.error("%s", exc)
        return error_response(database_unavailable_error())

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        content_type = request.headers.get("content-type", "")
        first = exc.errors()[0] if exc.errors() else {}
        in_body = tuple(first.get("loc", ()))[:1] == ("body",)
        if in_body and request.method == "POST" and "json" not in content_type:
            # curl -d sends a form's content type: the body was never read as JSON.
            message = (
                "send the body as JSON with the header Content-Type: application/json "
                f"(this request's content type: {content_type or 'none'})"
            )
            return error_response(ApiError(400, message, code="unsupported_content_type"))
        unknown = _unknown(exc)
        if unknown is not None:
            return error_response(unknown)
        message, param = _validation_message(exc)
        return error_response(ApiError(400, message, param=param))

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError) and isinstance(cause.object, bytes):
            return error_response(_undecodable(cause.object))  # FastAPI's "error parsing"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(ApiError(exc.status_code, str(exc.detail), code=code))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if database_down(exc):  # the database's driver's errors: refused, reset, pool full
            return await database_unavailable(request, exc)
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
