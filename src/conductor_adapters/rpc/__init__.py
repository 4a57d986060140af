"""gRPC glue shared by the services: pydantic <-> protobuf conversions and typed clients.

The orchestration core speaks pydantic (conductor.ports, conductor.workflow); the wire speaks
``conductor.v1``. Converting in one place keeps both sides free of each other's types.
"""
