"""``conductor db wait``: what a pod's init container runs until the migrations Job is done."""

from __future__ import annotations

import pytest

from fakes.cli import run_conductor

pytestmark = [pytest.mark.processes]


def test_it_waits_for_this_releases_schema_and_gives_up_with_the_reason(sqlite_url: str) -> None:
    env = {"CONDUCTOR_DATABASE_URL": sqlite_url}

    # Before the migrations: it checks, waits, and gives up at its deadline, saying why
    early = run_conductor("db", "wait", "--timeout", "0.5", "--interval", "0.2", env=env)
    assert early.returncode == 1, early.stderr
    assert "waiting:" in early.stderr
    assert "gave up after 0.5 s" in early.stderr
    assert "run `conductor db upgrade` first" in early.stderr

    # After them: it answers at once
    assert run_conductor("db", "upgrade", env=env).returncode == 0
    ready = run_conductor("db", "wait", "--timeout", "5", env=env)
    assert ready.returncode == 0, ready.stderr
    assert "holds this release's schema" in ready.stdout
