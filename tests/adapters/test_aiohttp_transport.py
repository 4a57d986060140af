"""Provider calls sent by aiohttp under the httpx API: each wire failure keeps the meaning httpx
gives it (a hang-up is not a timeout), bodies and headers pass as sent, and a client used from
two event loops leaves nothing open."""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from conductor.errors import ProviderRejected, ProviderTimeout, ProviderUnavailable
from conductor_adapters.http_wire import new_client, post_json
from conductor_adapters.loop_thread import LoopThread

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def _answer(status: str, body: bytes, *headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class RawServer:
    """A TCP server on loopback whose every connection is handled by ``handler``; on exit its
    connections are closed and their handlers ended."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self.handler(reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with new_client() as made:
        yield made


async def _call(client: httpx.AsyncClient, url: str, timeout_s: float = 5.0) -> object:
    return await post_json(
        client, url, {"authorization": "Bearer sk-test"}, {"q": "hi"}, timeout_s, "fake"
    )


async def test_a_server_that_hangs_up_is_unavailable_not_a_timeout(
    client: httpx.AsyncClient,
) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async with RawServer(hang_up) as url:
        with pytest.raises(ProviderUnavailable, match=r"cannot reach .*RemoteProtocolError"):
            await _call(client, url)


async def test_a_garbled_answer_is_unavailable(client: httpx.AsyncClient) -> None:
    async def garble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        writer.close()

    async with RawServer(garble) as url:
        with pytest.raises(ProviderUnavailable, match="RemoteProtocolError"):
            await _call(client, url)


async def test_a_silent_server_times_out(client: httpx.AsyncClient) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async with RawServer(silent) as url:
        with pytest.raises(ProviderTimeout):
            await _call(client, url, timeout_s=0.3)


async def test_a_url_without_http_is_rejected(client: httpx.AsyncClient) -> None:
    with pytest.raises(ProviderRejected, match="bad URL"):
        await _call(client, "ftp://127.0.0.1:1/v1/chat/completions")


async def test_body_headers_and_compressed_answers_pass_as_sent(
    client: httpx.AsyncClient,
) -> None:
    received: list[tuple[bytes, bytes]] = []

    async def gzipped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():  # keep-alive: several requests on one connection
            received.append(await _read_request(reader))
            body = gzip.compress(json.dumps({"answer": len(received)}).encode())
            headers = ("Content-Type: application/json", "Content-Encoding: gzip")
            writer.write(_answer("200 OK", body, *headers))
            await writer.drain()

    async with RawServer(gzipped) as url:
        assert await _call(client, url) == {"answer": 1}
        assert await _call(client, url) == {"answer": 2}  # the same connection, kept alive
    head, body = received[0]
    assert json.loads(body) == {"q": "hi"}
    lowered = head.lower()
    assert b"authorization: bearer sk-test" in lowered
    assert lowered.count(b"content-length:") == 1
    assert lowered.count(b"host:") == 1


async def test_a_client_used_from_two_loops_closes_both_sessions() -> None:
    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer("200 OK", b"{}", "Content-Type: application/json"))
        await writer.drain()
        await asyncio.sleep(1)  # the connection stays open, as a kept-alive one does

    other = LoopThread("test-other-loop")
    client = new_client()
    async with RawServer(ok) as url:
        assert await _call(client, url) == {}
        # The same client on another loop (a gateway loop, say) gets a session there, and the
        # first one is closed; closing from here closes the other loop's session, there.
        on_other = asyncio.run_coroutine_threadsafe(_call(client, url), other.loop)
        assert await asyncio.wrap_future(on_other) == {}
        await client.aclose()
    other.stop()
    # A session or connector left open warns when collected (aiohttp's ResourceWarning),
    # which pytest reports as this test's failure.
    del client, on_other
    gc.collect()


async def test_proxies_come_from_the_environment_and_no_proxy_is_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen_by_proxy: list[bytes] = []
    seen_direct: list[bytes] = []

    def answering(seen: list[bytes]) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head, _ = await _read_request(reader)
            seen.append(head.split(b"\r\n")[0])
            writer.write(_answer("200 OK", b'{"ok": true}', "Content-Type: application/json"))
            await writer.drain()

        return handle

    async with (
        RawServer(answering(seen_by_proxy)) as proxy,
        RawServer(answering(seen_direct)) as direct,
    ):
        proxy_base = proxy.removesuffix("/v1/chat/completions")
        for name in ("HTTP_PROXY", "http_proxy"):
            monkeypatch.setenv(name, proxy_base)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.setenv(name, "127.0.0.1")
        async with new_client() as client:  # the environment is read when a client is made
            assert await _call(client, "http://provider.invalid/v1/chat/completions") == {
                "ok": True
            }
            assert await _call(client, direct) == {"ok": True}
    assert seen_by_proxy == [b"POST http://provider.invalid/v1/chat/completions HTTP/1.1"]
    assert seen_direct == [b"POST /v1/chat/completions HTTP/1.1"]
