"""gRPC server reflection, v1 beside v1alpha, for the services' servers.

grpcio-reflection (1.85) serves ``grpc.reflection.v1alpha.ServerReflection`` only (v1 for
Python is grpc/grpc#38576, open), and clients that speak only v1 (tonic's and grpc-java's,
Postman, grpcurl from its first try) get UNIMPLEMENTED from it. v1 is v1alpha's protocol under
another package, message for message and field for field, so v1alpha's servicer answers v1's
requests as they are: it is registered a second time under v1's name, and v1's file (v1alpha's,
renamed) is added to the descriptor pool so that v1 itself can be described too.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import (  # type: ignore[import-untyped]
    reflection,
    reflection_pb2,
)

V1ALPHA_SERVICE: str = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"
_V1ALPHA_PACKAGE = V1ALPHA_SERVICE.rsplit(".", 1)[0]


def _register_v1_file() -> None:
    """v1's file, made of v1alpha's, in the default pool (once; left alone when a later
    grpcio-reflection has added its own)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    proto.ClearField("options")

    def renamed(type_name: str) -> str:
        return type_name.replace(f".{_V1ALPHA_PACKAGE}.", f".{V1_PACKAGE}.")

    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = renamed(field.type_name)
    for service in proto.service:
        for method in service.method:
            method.input_type = renamed(method.input_type)
            method.output_type = renamed(method.output_type)
    pool.Add(proto)


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Reflection v1alpha and v1 on ``server``, listing ``service_names`` and both reflection
    services."""
    _register_v1_file()
    names = (*service_names, V1ALPHA_SERVICE, V1_SERVICE)
    reflection.enable_server_reflection(names, server)
    servicer = reflection.aio.ReflectionServicer(names)
    info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    handler = grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": info})
    server.add_generic_rpc_handlers((handler,))
