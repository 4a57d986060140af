"""The gRPC request guard: what a server answers to unreadable requests and failed handlers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from conductor.errors import InvalidRequest
from conductor_adapters.rpc.guard import INTERNAL_MESSAGE, RequestGuard
from conductor_adapters.rpc.v1 import workflows_pb2

SECRET_SQL = "SELECT labels FROM workflow WHERE tenant = 'acme'"


async def _fails(request: Any, context: grpc.aio.ServicerContext) -> Any:
    raise RuntimeError(f"(psycopg.DataError) {SECRET_SQL}")


async def _refuses(request: Any, context: grpc.aio.ServicerContext) -> Any:
    raise InvalidRequest("question: too long", param="question")


async def _echo(request: Any, context: grpc.aio.ServicerContext) -> Any:
    return workflows_pb2.GetRequest(workflow_id=request.variant)


async def _stream_fails(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    yield workflows_pb2.GetRequest(workflow_id="first")
    raise RuntimeError(SECRET_SQL)


def _handlers() -> grpc.GenericRpcHandler:
    def unary(behavior: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=workflows_pb2.ListRequest.FromString,
            response_serializer=workflows_pb2.GetRequest.SerializeToString,
        )

    return grpc.method_handlers_generic_handler(
        "test.Guarded",
        {
            "Fails": unary(_fails),
            "Refuses": unary(_refuses),
            "Echo": unary(_echo),
            "StreamFails": grpc.unary_stream_rpc_method_handler(
                _stream_fails,
                request_deserializer=workflows_pb2.ListRequest.FromString,
                response_serializer=workflows_pb2.GetRequest.SerializeToString,
            ),
        },
    )


async def _call(method: str, request: bytes, *, stream: bool = False) -> tuple[Any, list[Any]]:
    """(status code, responses) of one call to a guarded server on loopback."""
    server = grpc.aio.server(interceptors=[RequestGuard()])
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    received: list[Any] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            path = f"/test.Guarded/{method}"
            try:
                if stream:
                    async for item in channel.unary_stream(path)(request, timeout=10):
                        received.append(item)
                else:
                    received.append(await channel.unary_unary(path)(request, timeout=10))
            except grpc.aio.AioRpcError as error:
                return error, received
            return None, received
    finally:
        await server.stop(None)


def test_an_unexpected_failure_is_internal_without_its_details() -> None:
    error, _ = asyncio.run(_call("Fails", b""))
    assert error.code() is grpc.StatusCode.INTERNAL
    assert error.details() == INTERNAL_MESSAGE


def test_a_stream_that_fails_midway_is_internal_without_its_details() -> None:
    error, received = asyncio.run(_call("StreamFails", b"", stream=True))
    assert len(received) == 1
    assert error.code() is grpc.StatusCode.INTERNAL
    assert SECRET_SQL not in error.details()


def test_an_invalid_request_is_invalid_argument_with_its_message() -> None:
    error, _ = asyncio.run(_call("Refuses", b""))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "question: too long"


@pytest.mark.parametrize("wire", [b"\x12\x02\xff\xfe", b"\x12\x50abc"], ids=["utf8", "short"])
def test_a_malformed_message_is_invalid_argument(wire: bytes) -> None:
    error, _ = asyncio.run(_call("Echo", wire))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "/test.Guarded/Echo" in error.details()
    assert "DecodeError" not in error.details()


def test_a_good_message_passes() -> None:
    request = workflows_pb2.ListRequest(variant="v").SerializeToString()
    error, [reply] = asyncio.run(_call("Echo", request))
    assert error is None
    assert workflows_pb2.GetRequest.FromString(reply).workflow_id == "v"
