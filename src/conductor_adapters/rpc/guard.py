"""What a gRPC server answers when a request cannot be read or a handler fails unexpectedly.

Left to grpcio, both are UNKNOWN with the Python exception in the details: a malformed
message (a corrupt wire format, a string field that is not UTF-8) names protobuf's DecodeError,
and an unexpected failure names its class and message (a database error's SQL, tables and
bound values). ``RequestGuard``, a server interceptor, answers INVALID_ARGUMENT to the first
and INTERNAL with a fixed message to the second (the log keeps the exception).

A failed deserializer cannot choose the status (grpcio aborts with UNKNOWN when it raises), so
the guard's deserializer returns a ``Malformed`` marker instead, and the guarded handler aborts
with INVALID_ARGUMENT when it receives one.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from conductor.errors import InvalidRequest

logger = logging.getLogger(__name__)

INTERNAL_MESSAGE = "internal error; the server log has the details"


class Malformed:
    """A request message that could not be parsed."""


_MALFORMED = Malformed()


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # DecodeError, and whatever else a parser of untrusted bytes raises
            return _MALFORMED

    return deserialize


async def _refuse_malformed(method: str, context: grpc.aio.ServicerContext) -> NoReturn:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{method}: the request is not a valid message of this method "
        "(a corrupt wire format, or a string field that is not UTF-8)",
    )
    raise AssertionError("unreachable: abort raises")


async def _failed(method: str, exc: Exception, context: grpc.aio.ServicerContext) -> NoReturn:
    """Abort for an exception a handler let out: INVALID_ARGUMENT for InvalidRequest (its
    message is written for clients), INTERNAL with a fixed message for anything else."""
    if isinstance(exc, InvalidRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    logger.error("%s failed", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    raise AssertionError("unreachable: abort raises")


def _guard_unary(
    method: str, behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is _MALFORMED:
            await _refuse_malformed(method, context)
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _failed(method, exc, context)

    return guarded


def _guard_stream(
    method: str, behavior: Callable[[Any, grpc.aio.ServicerContext], Any]
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    """A streaming handler guarded: an async generator, or a coroutine that writes its
    responses with ``context.write`` (grpcio's own health service)."""

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if request is _MALFORMED:
            await _refuse_malformed(method, context)
        try:
            responses = behavior(request, context)
            if inspect.isawaitable(responses):
                await responses
                return
            async for response in responses:
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _failed(method, exc, context)

    return guarded


def _checked_stream(
    method: str, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    async def checked() -> AsyncIterator[Any]:
        async for request in requests:
            if request is _MALFORMED:
                await _refuse_malformed(method, context)
            yield request

    return checked()


class RequestGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every method of the server it is given to (see the module)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None  # an unknown method: grpcio answers UNIMPLEMENTED
        method = str(details.method)
        deserialize, serialize = _safe(handler.request_deserializer), handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(method, handler.unary_unary), deserialize, serialize
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _guard_stream(method, handler.unary_stream), deserialize, serialize
            )
        if handler.stream_unary is not None:
            behavior = handler.stream_unary

            async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                return await behavior(_checked_stream(method, requests, context), context)

            return grpc.stream_unary_rpc_method_handler(
                _guard_unary(method, stream_unary), deserialize, serialize
            )
        streaming = handler.stream_stream

        def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return streaming(_checked_stream(method, requests, context), context)

        return grpc.stream_stream_rpc_method_handler(
            _guard_stream(method, stream_stream), deserialize, serialize
        )
