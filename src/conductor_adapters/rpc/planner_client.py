"""``GrpcPlanner``: the Planner port (conductor.ports.Planner) over gRPC to ``conductor planner``.

The distributed aggregator plans through this client. gRPC failures become the planner's
branch of the exception tree (``PlannerError``), so callers retry on ``retryable``, and every
message names the planner address that failed.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from conductor.errors import (
    InvalidRequest,
    PlannerCallFailed,
    PlannerError,
    PlannerRejected,
    PlannerTimeout,
    PlannerUnavailable,
)
from conductor.ports import PlanRequest
from conductor.workflow import PlanOutcome
from conductor_adapters.rpc.planner_wire import outcome_from_proto, request_to_proto
from conductor_adapters.rpc.v1 import planner_pb2, planner_pb2_grpc

PLANNER_SERVICE: str = planner_pb2.DESCRIPTOR.services_by_name["Planner"].full_name
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
# Calls spread over every address the planner's name resolves to (a headless Service: one per
# ready pod), not all down the first connection: one HTTP/2 connection carries every call.
CLIENT_OPTIONS = (*CHANNEL_OPTIONS, ("grpc.lb_policy_name", "round_robin"))
# Codes a later call may not get: the planner was down, still loading, overloaded or restarting.
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,  # the server cancelled the call (e.g. it shut down)
    }
)


class GrpcPlanner:
    """A Planner calling ``conductor.v1.Planner/Plan`` at ``address`` (host:port).

    The channel is opened on the first call, inside the caller's event loop (grpc.aio channels
    belong to one loop). ``timeout_s`` bounds each call, end to end: the server sees it as the
    call's deadline.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 300.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._credentials = credentials
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    def _planner_stub(self) -> Any:
        if self._stub is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(self.address, options=CLIENT_OPTIONS)
            else:
                channel = grpc.aio.secure_channel(
                    self.address, self._credentials, options=CLIENT_OPTIONS
                )
            self._channel = channel
            self._stub = planner_pb2_grpc.PlannerStub(channel)
        return self._stub

    async def plan(self, request: PlanRequest) -> PlanOutcome:
        stub = self._planner_stub()
        try:
            response = await stub.Plan(request_to_proto(request), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        try:
            return outcome_from_proto(response.call)
        except InvalidRequest as exc:
            raise PlannerCallFailed(f"planner at {self.address} sent a bad plan: {exc}") from None

    async def serving(self, *, timeout_s: float = 2.0) -> bool:
        """True when the planner's health service reports it SERVING (readiness probes)."""
        self._planner_stub()
        health = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = await health.Check(
                health_pb2.HealthCheckRequest(service=PLANNER_SERVICE), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        serving: bool = reply.status == health_pb2.HealthCheckResponse.SERVING
        return serving

    def _error(self, exc: grpc.aio.AioRpcError) -> PlannerError:
        code, details = exc.code(), exc.details() or ""
        where = f"planner at {self.address}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PlannerTimeout(f"{where} did not answer within {self.timeout_s:g} s")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return PlannerRejected(f"{where} rejected the request: {details}")
        if code in _RETRYABLE:
            return PlannerUnavailable(f"{where} is unavailable ({code.name}): {details}")
        return PlannerCallFailed(f"{where} failed with {code.name}: {details}")

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    def __repr__(self) -> str:
        return f"GrpcPlanner({self.address!r}, timeout_s={self.timeout_s:g})"
