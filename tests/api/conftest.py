"""The ``api`` fixture: one live API per module and runtime (embedded, distributed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.api_fixture import API_RUNTIMES, Api, running_api


@pytest.fixture(scope="module", params=API_RUNTIMES)
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    yield from running_api(request, tmp_path_factory)
