"""Who is calling: ``Authorization: Bearer cnd_...`` checked against the stored keys.

An embedded server (``conductor serve``) may run open while no key exists: every request is
then the "default" tenant, whatever key the client sends (SDKs insist on sending one). From
the moment a key is created (within the second a server reuses a key check for),
every request needs a live key.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from fastapi import Depends, Request

from conductor.errors import DatabaseUnavailableError
from conductor_adapters.store.db import database_down
from conductor_api.errors import ApiError
from conductor_api.rules import Caller
from conductor_api.service import WorkflowService

OPEN_TENANT = "default"
MISSING_KEY = (
    "missing API key: send 'Authorization: Bearer <key>' "
    "(an operator makes keys with `conductor keys create --tenant NAME`)"
)


def service_of(request: Request) -> WorkflowService:
    """The service behind the app (``create_app`` keeps it in the app's state)."""
    service: WorkflowService = request.app.state.service
    return service


async def current_caller(request: Request) -> Caller:
    try:
        return await identify(
            service_of(request),
            request.headers.get("authorization", ""),
            open_access=request.app.state.open_access,
        )
    except Exception as exc:
        if not database_down(exc):
            raise
        # FastAPI validates a request's parameters and body after its dependencies: the
        # caller stays unknown until a route reads it (the 503), so that a request's own
        # faults are still answered 400 while the database is down.
        return cast(Caller, _Unidentified(exc))


class _Unidentified:
    """A caller the database could not identify: reading anything of it raises
    DatabaseUnavailableError (the 503), so no route can act for it."""

    def __init__(self, cause: BaseException) -> None:
        self._cause = cause

    def __getattr__(self, name: str) -> Any:
        raise DatabaseUnavailableError(f"cannot check the API key: {self._cause}") from self._cause


async def identify(service: WorkflowService, authorization: str, *, open_access: bool) -> Caller:
    """The caller an ``Authorization`` header names; ApiError 401 when it names none."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    key = None
    if scheme.lower() == "bearer" and token:
        key = await service.keys.authenticate(token)
    if key is not None:
        allowed = tuple(key.allowed_pool) if key.allowed_pool is not None else None
        return Caller(
            tenant=key.tenant,
            allowed_pool=allowed,
            key_id=key.id,
            limits=key.limits,
            signs_webhooks=key.signs_webhooks,
        )
    if open_access and not await service.keys.any_key_exists():
        return Caller(tenant=OPEN_TENANT)
    if not token:
        raise ApiError(401, MISSING_KEY, code="invalid_api_key")
    raise ApiError(401, "invalid API key (unknown, revoked or mistyped)", code="invalid_api_key")


CallerDep = Annotated[Caller, Depends(current_caller)]
ServiceDep = Annotated[WorkflowService, Depends(service_of)]
