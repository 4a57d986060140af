"""gRPC ``conductor.v1.Workflows`` (Submit, Get, Watch, Cancel, List), served by the api
process beside the standard health and reflection services (so `grpcurl list` works).

Same keys, tenants and rules as the HTTP API, which are the service's
(``conductor_api.service``): this module translates between protobuf and the service. The key
goes in the ``authorization`` metadata (``Bearer <key>``); another tenant's workflow is
NOT_FOUND; where the key stands against its limits comes back as initial metadata (the HTTP
API's ``x-ratelimit-*`` headers).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from conductor.errors import InvalidRequest
from conductor.machine import FINAL_EVENT_KINDS
from conductor_adapters.rpc.guard import clipped
from conductor_adapters.rpc.reflection import enable_reflection
from conductor_adapters.rpc.v1 import common_pb2, workflows_pb2, workflows_pb2_grpc
from conductor_api.answers import AnswerText, follow_with_answer
from conductor_api.auth import identify
from conductor_api.errors import ApiError, not_found, runs_elsewhere
from conductor_api.reads import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    MAX_SEQUENCE,
    WorkflowFilter,
)
from conductor_api.rules import Caller, check_filter
from conductor_api.runtime import WorkflowElsewhere
from conductor_api.service import WorkflowService
from conductor_api.wire import (
    WORKFLOW_STATUS,
    answer_delta_to_proto,
    event_to_proto,
    summary_to_proto,
    workflow_to_proto,
)

WORKFLOWS_SERVICE: str = workflows_pb2.DESCRIPTOR.services_by_name["Workflows"].full_name

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class WorkflowsServicer(workflows_pb2_grpc.WorkflowsServicer):  # type: ignore[misc]
    def __init__(self, service: WorkflowService, *, open_access: bool = False) -> None:
        self.service = service
        self.open_access = open_access

    async def Submit(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await self._caller(context)
        try:
            started = await self.service.start_workflow(
                caller,
                request.question,
                variant=request.variant or None,
                pool=list(request.pool) or None,
                max_steps=request.max_steps if request.HasField("max_steps") else None,
                cost_weight=request.cost_weight if request.HasField("cost_weight") else None,
                metadata=dict(request.metadata),
                stream_answer=request.stream_answer,
            )
        except (InvalidRequest, ValueError) as exc:
            await _abort(context, ApiError(400, str(exc)))
        except ApiError as refused:
            await _abort(context, refused)
        if started.limit_headers:
            await context.send_initial_metadata(tuple(started.limit_headers.items()))
        return workflows_pb2.SubmitResponse(
            workflow_id=str(started.workflow_id), status=common_pb2.WORKFLOW_STATUS_QUEUED
        )

    async def Get(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await self._caller(context)
        workflow_id = await _workflow_id(request.workflow_id, context)
        view = await self.service.read(workflow_id, caller.tenant)
        if view is None:
            await _abort(context, ApiError(404, f"workflow {workflow_id} not found"))
        return workflow_to_proto(view)

    async def Cancel(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await self._caller(context)
        workflow_id = await _workflow_id(request.workflow_id, context)
        try:
            await self.service.cancel(workflow_id, caller.tenant, "cancelled by its client")
        except LookupError:
            await _abort(context, not_found(f"workflow {workflow_id}"))
        except WorkflowElsewhere:
            await _abort(context, runs_elsewhere(workflow_id))
        return await self.Get(workflows_pb2.GetRequest(workflow_id=str(workflow_id)), context)

    async def List(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await self._caller(context)
        limit = request.limit or DEFAULT_PAGE_SIZE
        if not 1 <= limit <= MAX_PAGE_SIZE:
            message = f"limit must be 1 to {MAX_PAGE_SIZE}, not {limit}"
            await _abort(context, ApiError(400, message))
        after = await _workflow_id(request.after, context, "after") if request.after else None
        try:
            check_filter(request.labels, request.variant)
        except InvalidRequest as exc:
            await _abort(context, ApiError(400, str(exc), param=exc.param))
        wanted = WorkflowFilter(
            status=_STATUS_NAMES.get(request.status),
            variant=request.variant or None,
            labels=dict(request.labels),
            created_after=_time(request, "created_after"),
            created_before=_time(request, "created_before"),
        )
        try:
            page, has_more = await self.service.list_page(
                caller.tenant, wanted, limit=limit, after=after
            )
        except InvalidRequest as exc:
            await _abort(context, ApiError(400, str(exc), param=exc.param))
        return workflows_pb2.ListResponse(
            workflows=[summary_to_proto(summary) for summary in page], has_more=has_more
        )

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        caller = await self._caller(context)
        workflow_id = await _workflow_id(request.workflow_id, context)
        after = min(max(0, request.after_sequence), MAX_SEQUENCE)
        if not await self.service.exists(workflow_id, caller.tenant):
            await _abort(context, ApiError(404, f"workflow {workflow_id} not found"))
        followed = follow_with_answer(self.service, workflow_id, caller.tenant, after)
        async with contextlib.aclosing(followed) as items:
            async for item in items:
                if isinstance(item, AnswerText):
                    # Not stored: numbered as the last stored event sent, the resume point.
                    yield answer_delta_to_proto(workflow_id, after, item.text, item.offset)
                    continue
                assert item is not None, "no keepalives asked for"
                outcome = None
                if item.kind in FINAL_EVENT_KINDS:
                    outcome = await self.service.read(workflow_id, caller.tenant)
                yield event_to_proto(item, outcome)
                after = item.sequence

    async def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        metadata = dict(context.invocation_metadata() or ())
        try:
            return await identify(
                self.service, str(metadata.get("authorization", "")), open_access=self.open_access
            )
        except ApiError as error:
            await _abort(context, error)


_STATUS_NAMES = {number: name for name, number in WORKFLOW_STATUS.items()}


def _time(request: Any, field: str) -> datetime | None:
    return getattr(request, field).ToDatetime(UTC) if request.HasField(field) else None


async def _workflow_id(
    text: str, context: grpc.aio.ServicerContext, field: str = "workflow_id"
) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        await _abort(context, ApiError(400, f"{field} {text!r} is not a UUID", param=field))


async def _abort(context: grpc.aio.ServicerContext, error: ApiError) -> NoReturn:
    if error.headers:  # a refusal at a key's limit: where it stands, and Retry-After
        context.set_trailing_metadata(tuple((k.lower(), v) for k, v in error.headers.items()))
    await context.abort(_CODES.get(error.status, grpc.StatusCode.INTERNAL), clipped(error.message))
    raise AssertionError("unreachable: abort raises")


def add_workflows_service(
    server: grpc.aio.Server, service: WorkflowService, *, open_access: bool = False
) -> Any:
    """Workflows, health (SERVING for "" and the Workflows service while the server runs) and
    reflection (v1 and v1alpha) on ``server``; returns the health servicer, for the shutdown to set
    NOT_SERVING."""
    workflows_pb2_grpc.add_WorkflowsServicer_to_server(
        WorkflowsServicer(service, open_access=open_access), server
    )
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    enable_reflection((WORKFLOWS_SERVICE, health.SERVICE_NAME), server)
    return checks


async def mark_serving(checks: Any) -> None:
    for name in (health.OVERALL_HEALTH, WORKFLOWS_SERVICE):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
