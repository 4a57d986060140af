"""What a gRPC server answers when a request cannot be read or a handler fails unexpectedly.

Left to grpcio, both are UNKNOWN with the Python exception in the details: a malformed
message (a corrupt wire format, a string field that is not UTF-8) names protobuf's DecodeError,
and an unexpected failure names its class and message (a database error's SQL, tables and
bound values). ``RequestGuard``, a server interceptor, answers INVALID_ARGUMENT to the first
and INTERNAL with a fixed message to the second (the log keeps the exception), UNAVAILABLE
where the database is down.

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
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from conductor.errors import InvalidRequest
from conductor_adapters.store.db import database_down

logger = logging.getLogger(__name__)

INTERNAL_MESSAGE = "internal error; the server log has the details"
DATABASE_DOWN_MESSAGE = "the trace database is unavailable; try again later"
# Status details travel in a trailer, which peers bound (grpc-core: 8 KiB of metadata); a
# refusal that quotes a huge value would reach the client as a failed call instead.
MAX_DETAILS_CHARS = 1000


def clipped(message: str) -> str:
    """``message`` cut to what a status's details can carry, saying so where it was cut."""
    if len(message) <= MAX_DETAILS_CHARS:
        return message
    return message[: MAX_DETAILS_CHARS - 30] + f"... ({len(message)} characters in all)"


class Malformed:
    """A request message that could not be parsed; ``field`` names the string field that is
    not UTF-8, where that is why."""

    def __init__(self, field: str | None = None) -> None:
        self.field = field


_MALFORMED = Malformed()


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def bad_utf8_field(descriptor: Descriptor, data: bytes) -> str | None:
    """The first string field (``outer.inner`` when nested, a map's ``labels.<key>``) whose
    bytes in the wire format ``data`` of ``descriptor`` are not UTF-8; None when there is none
    or the wire format itself is corrupt."""
    by_number = {field.number: field for field in descriptor.fields}
    at = 0
    try:
        while at < len(data):
            tag, at = _varint(data, at)
            number, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                _, at = _varint(data, at)
                continue
            if wire_type in (1, 5):
                at += 8 if wire_type == 1 else 4
                continue
            if wire_type != 2:
                return None
            size, at = _varint(data, at)
            payload, at = data[at : at + size], at + size
            field = by_number.get(number)
            if field is None:
                continue
            if field.type == FieldDescriptor.TYPE_STRING:
                try:
                    payload.decode("utf-8")
                except UnicodeDecodeError:
                    return str(field.name)
            elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
                inner = bad_utf8_field(field.message_type, payload)
                if inner is not None:
                    if field.message_type.GetOptions().map_entry:
                        return f"{field.name}.<{inner}>" if inner == "key" else str(field.name)
                    return f"{field.name}.{inner}"
    except ValueError:  # a truncated varint: the wire format itself is corrupt
        return None
    return None


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    # A generated message class's FromString: its class, whose descriptor names the fields.
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # DecodeError, and whatever else a parser of untrusted bytes raises
            if isinstance(descriptor, Descriptor):
                return Malformed(bad_utf8_field(descriptor, data))
            return _MALFORMED

    return deserialize


async def _refuse_malformed(
    method: str, request: Malformed, context: grpc.aio.ServicerContext
) -> NoReturn:
    if request.field is not None:
        message = (
            f"{method}: the request is not a valid message of this method: {request.field} "
            "is not UTF-8 (an overlong form, an encoded surrogate, a stray byte)"
        )
    else:
        message = (
            f"{method}: the request is not a valid message of this method "
            "(a corrupt wire format, or a string field that is not UTF-8)"
        )
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
    raise AssertionError("unreachable: abort raises")


async def _failed(method: str, exc: Exception, context: grpc.aio.ServicerContext) -> NoReturn:
    """Abort for an exception a handler let out: INVALID_ARGUMENT for InvalidRequest (its
    message is written for clients), UNAVAILABLE when the database is down, INTERNAL with a
    fixed message for anything else."""
    if isinstance(exc, InvalidRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, clipped(str(exc)))
    if database_down(exc):  # as the HTTP API's 503: try again later
        logger.error("%s: %s", method, exc)
        await context.abort(grpc.StatusCode.UNAVAILABLE, DATABASE_DOWN_MESSAGE)
    logger.error("%s failed", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    raise AssertionError("unreachable: abort raises")


def _guard_unary(
    method: str, behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await _refuse_malformed(method, request, context)
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
        if isinstance(request, Malformed):
            await _refuse_malformed(method, request, context)
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
            if isinstance(request, Malformed):
                await _refuse_malformed(method, request, context)
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
