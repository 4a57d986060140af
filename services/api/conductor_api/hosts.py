"""Which ``Host`` names the HTTP API answers: the defence against DNS rebinding.

A web page whose name its owner re-points at 127.0.0.1 can make the visitor's browser send
requests to a server on the visitor's loopback, and read the answers (same origin, as far as
the browser knows). Listening on loopback does not help: the browser is on the loopback. What
gives it away is the ``Host`` header, which still names the page's host. So an open server (no
API key exists) answers loopback names only (``localhost``, ``127.0.0.1``, ``[::1]``, any
port), and, where the operator lists names in CONDUCTOR_ALLOWED_HOSTS, every server answers
those and loopback names only. A server with keys and no list answers any name: a rebinding
page cannot present a key it does not know.

gRPC needs no such check: browsers cannot speak it (grpc-web needs a proxy in front).
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import ip_address

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from conductor_api.errors import error_body
from conductor_api.service import WorkflowService

# Probes (kubelet's, a load balancer's) name the pod's address: they must not depend on a list.
UNCHECKED_PATHS = frozenset({"/healthz", "/readyz"})


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower case, without its port: ``[::1]:8000`` -> ``[::1]``."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header if end < 0 else header[: end + 1]
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


def is_loopback_name(name: str) -> bool:
    """``localhost`` or a loopback address literal (``127.0.0.1``, ``[::1]``): names a page
    elsewhere cannot take for itself."""
    if name == "localhost":
        return True
    try:
        return ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def host_allowed(name: str, allowed: Sequence[str]) -> bool:
    """Whether ``name`` (as ``host_name`` gives it) is loopback or matches ``allowed``: exact
    names, ``*.example.com`` for any name below example.com, ``*`` for any name."""
    if is_loopback_name(name):
        return True
    for pattern in allowed:
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


class HostCheck:
    """Refuses requests whose ``Host`` the server does not answer (see the module), with 403."""

    def __init__(
        self,
        app: ASGIApp,
        service: WorkflowService,
        *,
        open_access: bool,
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.service = service
        self.open_access = open_access
        self.allowed = tuple(h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCHECKED_PATHS or not await self._checks():
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        name = host_name(header)
        if host_allowed(name, self.allowed):
            await self.app(scope, receive, send)
            return
        message = (
            f"this server does not answer for the host {name[:100]!r}: "
            + (
                "it is open (no API key exists), so it answers loopback names only "
                "(localhost, 127.0.0.1, [::1])"
                if not self.allowed
                else "it is not in CONDUCTOR_ALLOWED_HOSTS"
            )
            + "; an operator allows it by adding it to CONDUCTOR_ALLOWED_HOSTS "
            "(comma-separated names, *.example.com for a domain)"
        )
        response = JSONResponse(error_body(403, message, code="host_not_allowed"), status_code=403)
        await response(scope, receive, send)

    async def _checks(self) -> bool:
        if self.allowed:
            return True
        # Open only while no key exists (the same cached answer authentication uses).
        return self.open_access and not await self.service.keys.any_key_exists()
