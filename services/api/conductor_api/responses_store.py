"""Stored responses as the Responses routes read them: one the tenant may read (404 for another
tenant's, a deleted one, or one sent with ``store: false``), its answer and status, and the
conversation a response continues with ``previous_response_id``."""

from __future__ import annotations

import asyncio
from typing import Any

from conductor_adapters.store.responses import StoredResponse, load_response
from conductor_api.errors import ApiError, not_found
from conductor_api.reads import load_workflow
from conductor_api.responses_objects import STATUS, output_items, parse_response_id
from conductor_api.responses_request import turns
from conductor_api.service import WorkflowService


async def stored_response(
    service: WorkflowService, value: str, tenant: str, param: str | None = None
) -> StoredResponse:
    """The tenant's stored response; 404 for another tenant's, a deleted one, or one sent with
    store=false."""
    parsed = parse_response_id(value)
    found = None
    if parsed is not None:
        found = await asyncio.to_thread(load_response, service.engine, parsed, tenant)
    if found is None or found.deleted_at is not None:
        error = not_found(f"response {value!r}")
        error.param = param
        raise error
    if not found.store:
        raise ApiError(
            404,
            f"response {value!r} was created with store=false: it is not kept, so it cannot be "
            "read back or continued",
            code="not_found",
            param=param,
        )
    return found


async def answer_of(
    service: WorkflowService, stored: StoredResponse
) -> tuple[str | None, str, list[dict[str, Any]]]:
    """A stored response's answer (None while it has none), its status, and the function
    calls it asked for."""
    if stored.workflow_id is None:
        output = stored.output or {}
        return output.get("text"), "completed", output.get("tool_calls") or []
    view = await asyncio.to_thread(load_workflow, service.engine, stored.workflow_id, stored.tenant)
    if view is None:
        return None, "failed", []
    calls = [call.model_dump() for call in view.tool_calls]
    return view.answer if view.status == "completed" else None, STATUS[view.status], calls


async def continued(
    service: WorkflowService, previous_id: str, tenant: str
) -> list[dict[str, str]]:
    """The conversation a response continues: the earlier one's, its input and its answer."""
    previous = await stored_response(service, previous_id, tenant, param="previous_response_id")
    answer, status, calls = await answer_of(service, previous)
    if status in ("queued", "in_progress"):
        raise ApiError(
            400,
            f"previous_response_id: response {previous_id!r} is still in progress; continue it "
            "once it has finished",
            code="previous_response_in_progress",
            param="previous_response_id",
        )
    history = previous.history + turns(previous.input_items)
    if answer is not None or calls:
        history += turns(output_items(previous, answer or "", calls))
    return history
