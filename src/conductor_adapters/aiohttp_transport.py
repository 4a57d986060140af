"""httpx requests sent by aiohttp: the httpx API the adapters are written against, with
aiohttp's connection handling underneath.

Why: a provider call through httpx's own transport (httpcore, h11, anyio) cost 0.6 ms of CPU
here, 0.36 ms through httpx on aiohttp (0.18 ms through aiohttp alone), and an embedded
one-step workflow makes two of them (the plan, the step). Swapping the transport cut the CPU
of an embedded workflow by about a sixth and the wall time of 500 one-second workflows in
flight by a third (measured with ``benchmarks/orchestration_overhead.py``). httpcore's pool
also rescans every connection it holds whenever a request starts or ends (encode/httpcore#1035);
aiohttp's does not.

Why not the ``httpx-aiohttp`` package: it maps every aiohttp connection error (a reset, a server
that hung up) to ``httpx.ConnectTimeout``, so a provider that disconnects would be reported as
one that timed out. Here each aiohttp failure becomes the httpx exception httpx itself raises
for it, which is what ``http_wire`` maps onto the provider error tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Iterator

import aiohttp
import httpx

from conductor.tracing import inject_traceparent

CHUNK_BYTES = 64 * 1024
# Idle connections are dropped before the servers commonly drop them (uvicorn, under vLLM,
# LiteLLM and this project's API, after 5 s): a request sent on a connection the server is
# closing that moment fails with "Server disconnected" before it was read.
KEEPALIVE_S = 4.0


@contextlib.contextmanager
def _as_httpx_errors(request: httpx.Request) -> Iterator[None]:
    """aiohttp's exceptions as the httpx ones httpx raises for the same failure."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
    except aiohttp.ServerTimeoutError as exc:  # no byte within the read timeout
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
    except aiohttp.ClientConnectorError as exc:  # refused, unresolvable, TLS failed
        raise httpx.ConnectError(str(exc), request=request) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientResponseError) as exc:
        raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request) from exc
    except (aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as exc:
        raise httpx.UnsupportedProtocol(str(exc), request=request) from exc
    except aiohttp.ClientError as exc:
        raise httpx.TransportError(f"{type(exc).__name__}: {exc}", request=request) from exc
    except TimeoutError as exc:
        raise httpx.ReadTimeout("read timed out", request=request) from exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors(self._request):
            async for chunk in self._response.content.iter_chunked(CHUNK_BYTES):
                yield chunk

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session per event loop, made on first use in that loop.

    No cap on connections (the gateway's quotas decide how many calls are in flight; a cap here
    would queue calls unseen); no redirects, cookies or decompression by aiohttp (httpx decodes
    bodies); proxies from HTTP(S)_PROXY and NO_PROXY, read when the transport is made, as httpx
    reads them when its client is made. (aiohttp's own ``trust_env`` reads the environment and
    parses ~/.netrc on every request: a sixth of a pass-through call's CPU.)
    """

    def __init__(self, tls: ssl.SSLContext) -> None:
        self._tls = tls
        self._proxies = {
            scheme: url
            for scheme, url in urllib.request.getproxies_environment().items()
            if scheme in ("http", "https", "all", "no")
        }
        self._proxy_by_host: dict[tuple[str, str], str | None] = {}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Future[None]] = set()

    def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session belongs to the loop it was made in: a client used from another loop
            # gets a session of its own there, and the old one is closed where it lives.
            closing = self._close_elsewhere()
            if closing is not None:
                task = asyncio.ensure_future(closing)
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            connector = aiohttp.TCPConnector(limit=0, ssl=self._tls, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                trust_env=False,
            )
            self._loop = loop
        return self._session

    def _close_elsewhere(self) -> Awaitable[None] | None:
        """What closes the session (None: nothing to close): on its own loop while that runs;
        else here, where only its bookkeeping is left (a closed loop's sockets went with it)."""
        session, loop = self._session, self._loop
        self._session = self._loop = None
        if session is None or session.closed or loop is None:
            return None
        if loop is asyncio.get_running_loop() or not loop.is_running():
            return session.close()
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(session.close(), loop))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        content = await request.aread()
        headers = request.headers.multi_items()
        inject_traceparent(headers)  # the provider's spans join the call's trace
        with _as_httpx_errors(request):
            response = await self._session_here().request(
                request.method,
                str(request.url),
                headers=headers,
                data=content or None,
                allow_redirects=False,
                compress=False,
                proxy=self._proxy_for(request.url.scheme, request.url.host),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=timeouts.get("connect"),
                    sock_read=timeouts.get("read"),
                ),
            )
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    def _proxy_for(self, scheme: str, host: str) -> str | None:
        key = (scheme, host)
        if key not in self._proxy_by_host:  # a handful of provider hosts: decided once each
            proxy = self._proxies.get(scheme) or self._proxies.get("all")
            bypassed = urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]
                host, self._proxies
            )
            self._proxy_by_host[key] = None if bypassed else proxy
        return self._proxy_by_host[key]

    async def aclose(self) -> None:
        closing = self._close_elsewhere()
        if closing is not None:
            await closing
