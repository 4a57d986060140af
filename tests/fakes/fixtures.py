"""Pytest fixtures for the fake servers; registered from tests/conftest.py via pytest_plugins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.openai_server import FakeOpenAIServer


@pytest.fixture(scope="session")
def _fake_openai_server() -> Iterator[FakeOpenAIServer]:
    # One server for the session: starting uvicorn costs ~0.2 s, resetting it costs nothing.
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def fake_openai(_fake_openai_server: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """A running fake OpenAI server with an empty script and log; use ``.base_url``."""
    _fake_openai_server.reset()
    yield _fake_openai_server
    _fake_openai_server.reset()
