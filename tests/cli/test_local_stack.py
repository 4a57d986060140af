"""The local stack's sizing of llama.cpp engines: their threads never outnumber the cores."""

from __future__ import annotations

import pytest

from conductor_cli.local_stack import engine_threads


@pytest.mark.parametrize(
    ("engines", "cpus", "threads"),
    [(1, 2, 2), (2, 2, 1), (3, 2, 1), (2, 8, 4), (3, 8, 2), (0, 4, 4)],
)
def test_each_engine_gets_its_share_of_the_cores(engines: int, cpus: int, threads: int) -> None:
    assert engine_threads(engines, cpus) == threads
