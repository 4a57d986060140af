"""Server reflection v1 beside v1alpha: a client that speaks only v1 (grpcurl's first try,
Postman, tonic's and grpc-java's clients) lists and describes the services, and v1alpha's
clients keep working."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2  # type: ignore[import-untyped]

from conductor_adapters.rpc.reflection import V1_SERVICE, V1ALPHA_SERVICE, enable_reflection

Requests = list[Any]


def v1_stub(channel: grpc.aio.Channel) -> Callable[..., Any]:
    """ServerReflectionInfo of reflection v1 and nothing else. v1's messages are v1alpha's
    under another package, field for field, so v1alpha's classes write and read them."""
    return channel.stream_stream(
        f"/{V1_SERVICE}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )


def v1alpha_stub(channel: grpc.aio.Channel) -> Callable[..., Any]:
    return channel.stream_stream(
        f"/{V1ALPHA_SERVICE}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )


async def _ask(stub: Callable[[grpc.aio.Channel], Callable[..., Any]], requests: Requests) -> Any:
    server = grpc.aio.server()
    enable_reflection(("grpc.health.v1.Health",), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return [reply async for reply in stub(channel)(iter(requests), timeout=10)]
    finally:
        await server.stop(None)


def _names(reply: Any) -> set[str]:
    return {service.name for service in reply.list_services_response.service}


def _files(reply: Any) -> Iterable[descriptor_pb2.FileDescriptorProto]:
    raw = reply.file_descriptor_response.file_descriptor_proto
    return [descriptor_pb2.FileDescriptorProto.FromString(r) for r in raw]


def test_a_v1_only_client_lists_the_services() -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")

    [reply] = asyncio.run(_ask(v1_stub, [request]))

    assert not reply.HasField("error_response")
    assert _names(reply) == {"grpc.health.v1.Health", V1_SERVICE, V1ALPHA_SERVICE}


def test_a_v1_only_client_describes_reflection_v1_itself() -> None:
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=V1_SERVICE)

    [reply] = asyncio.run(_ask(v1_stub, [request]))

    assert not reply.HasField("error_response"), reply.error_response
    [described] = [f for f in _files(reply) if f.package == "grpc.reflection.v1"]
    [service] = described.service
    assert service.name == "ServerReflection"
    [method] = service.method
    assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
    assert method.client_streaming
    assert method.server_streaming


def test_a_v1alpha_client_keeps_working() -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")

    [reply] = asyncio.run(_ask(v1alpha_stub, [request]))

    assert _names(reply) == {"grpc.health.v1.Health", V1_SERVICE, V1ALPHA_SERVICE}
