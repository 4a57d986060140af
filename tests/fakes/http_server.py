"""A scripted HTTP server on loopback: the base every vendor fake (OpenAI, later others) builds on.

Adapters are tested over real sockets, not a mocked transport, so timeouts, refused connections,
headers and raw bodies behave as they do against the vendor. The server is a Starlette app run
by uvicorn in a background thread on 127.0.0.1, port 0; tests script it from their own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@dataclass(frozen=True)
class ScriptedResponse:
    """One response to serve: ``json`` is encoded for you; ``body`` (raw) wins when both are set."""

    status: int = 200
    json: Any = None
    body: bytes | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait before answering (timeouts); cut short when the server stops


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    json: Any  # the decoded body, or None when it is not JSON


class ScriptedServer:
    """Serves queued ScriptedResponses in order, then ``default_response``; logs every request."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.port = 0
        self._queue: deque[ScriptedResponse] = deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()  # replaced in the server's own loop by _lifespan
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=ALL_METHODS)],
            lifespan=self._lifespan,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def enqueue(self, *responses: ScriptedResponse) -> None:
        with self._lock:
            self._queue.extend(responses)

    def reset(self) -> None:
        """Forget the script and the log, so one server can serve many tests."""
        with self._lock:
            self._queue.clear()
            self.requests.clear()

    @property
    def last_request(self) -> RecordedRequest:
        with self._lock:
            if not self.requests:
                raise AssertionError("the fake server has received no request")
            return self.requests[-1]

    def default_response(self, request: RecordedRequest) -> ScriptedResponse:
        """What to answer when the queue is empty; vendor fakes override this."""
        return ScriptedResponse(status=404, json={"detail": f"no route for {request.path}"})

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        try:
            decoded = json.loads(body) if body else None
        except ValueError:
            decoded = None
        recorded = RecordedRequest(
            method=request.method,
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            json=decoded,
        )
        with self._lock:
            self.requests.append(recorded)
            scripted = self._queue.popleft() if self._queue else None
        if scripted is None:
            scripted = self.default_response(recorded)
        await self._sleep(scripted.delay_s)
        return _to_response(scripted)

    async def _sleep(self, seconds: float) -> None:
        # Cut short by stop(), so shutdown never waits on a handler whose client already gave up.
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), seconds)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        yield

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="on",
            log_level="warning",
            access_log=False,
            http="h11",
            ws="none",
            loop="asyncio",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"{type(self).__name__} did not start on port {self.port}")
            time.sleep(0.005)

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._server.should_exit = True
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            raise RuntimeError(f"{type(self).__name__} on port {self.port} did not stop")
        self._server = self._thread = self._loop = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _to_response(scripted: ScriptedResponse) -> Response:
    headers = dict(scripted.headers)
    if scripted.body is not None:
        media_type = None if _has(headers, "content-type") else "text/plain"
        return Response(scripted.body, scripted.status, headers, media_type)
    if scripted.json is None:
        return Response(b"", scripted.status, headers)
    media_type = None if _has(headers, "content-type") else "application/json"
    return Response(json.dumps(scripted.json), scripted.status, headers, media_type)


def _has(headers: Mapping[str, str], name: str) -> bool:
    return any(key.lower() == name for key in headers)
