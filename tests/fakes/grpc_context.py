"""What a gRPC servicer uses of its context, for calling a servicer in process (no server):
the caller's key as metadata, and what the servicer sent back or aborted with."""

from __future__ import annotations

import grpc


class Aborted(Exception):
    """The servicer aborted the call (``GrpcContext.code`` and ``details`` say how)."""


class GrpcContext:
    def __init__(self, secret: str) -> None:
        self.metadata = (("authorization", f"Bearer {secret}"),)
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.initial: tuple[tuple[str, str], ...] = ()
        self.trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def send_initial_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.initial = metadata

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise Aborted(details)
