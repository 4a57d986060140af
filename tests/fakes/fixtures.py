"""Pytest fixtures for the fake servers; registered from tests/conftest.py via pytest_plugins.

One server per vendor for the session (starting uvicorn costs ~0.2 s, resetting it costs
nothing); each test gets it with an empty script and log.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import pytest

from fakes.anthropic_server import FakeAnthropicServer
from fakes.gemini_server import FakeGeminiServer
from fakes.http_server import ScriptedServer
from fakes.openai_server import FakeOpenAIServer

ServerT = TypeVar("ServerT", bound=ScriptedServer)


def _fresh(server: ServerT) -> Iterator[ServerT]:
    server.reset()
    yield server
    server.reset()


@pytest.fixture(scope="session")
def _fake_openai_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="session")
def _fake_anthropic_server() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        yield server


@pytest.fixture(scope="session")
def _fake_gemini_server() -> Iterator[FakeGeminiServer]:
    with FakeGeminiServer() as server:
        yield server


@pytest.fixture
def fake_openai(_fake_openai_server: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """A running fake OpenAI server with an empty script and log; use ``.base_url``."""
    yield from _fresh(_fake_openai_server)


@pytest.fixture
def fake_anthropic(_fake_anthropic_server: FakeAnthropicServer) -> Iterator[FakeAnthropicServer]:
    """A running fake Anthropic server with an empty script and log; use ``.base_url``."""
    yield from _fresh(_fake_anthropic_server)


@pytest.fixture
def fake_gemini(_fake_gemini_server: FakeGeminiServer) -> Iterator[FakeGeminiServer]:
    """A running fake Gemini server with an empty script and log; use ``.base_url``."""
    yield from _fresh(_fake_gemini_server)
