"""A scripted HTTP server on loopback: the base of every vendor fake (OpenAI, Anthropic, Gemini).

Adapters are tested over real sockets, not a mocked transport, so timeouts, refused connections,
headers and raw bodies behave as they do against the vendor. The server is a Starlette app run
by uvicorn in a background thread on 127.0.0.1, port 0; tests script it from their own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
CONTROL_PATH = "/_fake/requests"  # not a vendor route: the fake's own request log


@dataclass(frozen=True)
class ScriptedResponse:
    """One response to serve: ``json`` is encoded for you; ``body`` (raw) wins when both are set."""

    status: int = 200
    json: Any = None
    body: bytes | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait before answering (timeouts); cut short when the server stops
    # A server-sent-event stream instead of a body: each item is one event's text, sent as is
    # (include the "data: ...\n\n" framing), ``event_delay_s`` apart.
    events: Sequence[str] | None = None
    event_delay_s: float = 0.0
    # Break the connection after this many events, with no end of the chunked body: the client
    # sees the stream cut mid-way, as when a provider's connection drops.
    cut_after: int | None = None


class StreamCut(Exception):
    """Raised inside a streaming body to drop the connection mid-stream (on purpose)."""


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    json: Any  # the decoded body, or None when it is not JSON
    received_at: float = 0.0  # time.time() when the request arrived (quota windows)
    in_flight: int = 0  # requests being served when this one arrived, itself included


class ScriptedServer:
    """Serves queued ScriptedResponses in order, then ``default_response``; logs every request."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        # Requests whose client went away while the answer was delayed, with time.time() then:
        # what a provider sees of a call cancelled mid-way.
        self.abandoned: list[tuple[RecordedRequest, float]] = []
        self.port = 0
        self.in_flight = 0
        self.max_in_flight = 0
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
            self.abandoned.clear()
            self.max_in_flight = self.in_flight

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
        if request.url.path == CONTROL_PATH:
            return self._control()
        body = await request.body()
        try:
            decoded = json.loads(body) if body else None
        except ValueError:
            decoded = None
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            recorded = RecordedRequest(
                method=request.method,
                path=request.url.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                json=decoded,
                received_at=time.time(),
                in_flight=self.in_flight,
            )
            self.requests.append(recorded)
            scripted = self._queue.popleft() if self._queue else None
        try:
            if scripted is None:
                scripted = self.default_response(recorded)
            await self._delay(scripted.delay_s, request, recorded)
        finally:
            with self._lock:
                self.in_flight -= 1
        if scripted.events is not None:
            return StreamingResponse(
                self._stream(scripted),
                scripted.status,
                dict(scripted.headers),
                media_type="text/event-stream",
            )
        return _to_response(scripted)

    async def _stream(self, scripted: ScriptedResponse) -> AsyncIterator[bytes]:
        for number, event in enumerate(scripted.events or ()):
            if scripted.cut_after is not None and number >= scripted.cut_after:
                raise StreamCut(f"stream cut after {number} events, as scripted")
            if number:
                await self._sleep(scripted.event_delay_s)
            yield event.encode()

    def _control(self) -> Response:
        """The request log as JSON, for tests that run this server in another process."""
        with self._lock:
            log = [
                {
                    "method": r.method,
                    "path": r.path,
                    "json": r.json,
                    "received_at": r.received_at,
                    "in_flight": r.in_flight,
                }
                for r in self.requests
            ]
            return Response(
                json.dumps({"requests": log, "max_in_flight": self.max_in_flight}),
                media_type="application/json",
            )

    async def _delay(self, seconds: float, request: Request, recorded: RecordedRequest) -> None:
        """Wait before answering, watching the client: one that closes the connection meanwhile
        is logged in ``abandoned`` and gets no answer. (The body is read, so the next message
        the server hands over is the disconnect: waited for, not polled.)"""
        if seconds <= 0:
            return

        async def client_gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        gone = asyncio.ensure_future(client_gone())
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            done, _ = await asyncio.wait(
                {gone, stopped}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in (gone, stopped):
                waiter.cancel()
            await asyncio.gather(gone, stopped, return_exceptions=True)
        if gone in done:
            with self._lock:
                self.abandoned.append((recorded, time.time()))

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

    def start(self, port: int = 0) -> None:
        logging.getLogger("uvicorn.error").addFilter(_hide_scripted_cuts)
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted connections only when the
        # listening socket says TCP, and without it each answer written in two parts waited
        # out the client's delayed ACK (40 ms per request on a kept-alive connection).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(2048)
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


def _hide_scripted_cuts(record: logging.LogRecord) -> bool:
    """uvicorn logs the exception that cuts a stream; a scripted cut is not a server error."""
    return not (record.exc_info and isinstance(record.exc_info[1], StreamCut))


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
