"""The outbox relay (conductor_adapters.outbox_relay): what ``conductor api`` stages goes out
once committed, in the background, retried while the broker is down, and never twice while a
sweeper holds the row."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from kombu.exceptions import OperationalError as BrokerOperationalError
from sqlalchemy import Engine, func, select

from conductor.machine import utcnow
from conductor.messaging import START_WORKFLOW_TASK
from conductor.variants import get_variant
from conductor_adapters import outbox_relay
from conductor_adapters.outbox_relay import OutboxRelay
from conductor_adapters.store import outbox
from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.models import outbox_table
from conductor_adapters.store.runs import SubmitRequest, stage_submission

pytestmark = pytest.mark.postgres


@dataclass
class FlakyApp:
    """A broker that refuses messages while ``down`` is set, and records what it took."""

    down: threading.Event = field(default_factory=threading.Event)
    sent: list[tuple[str, list[Any]]] = field(default_factory=list)
    refused: int = 0

    def send_task(self, name: str, *, args: list[Any], queue: str, **options: Any) -> None:
        if self.down.is_set():
            self.refused += 1
            raise BrokerOperationalError("Error 111 connecting to 127.0.0.1:6379.")
        self.sent.append((name, args))


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    upgrade(postgres_url)
    engine = make_engine(postgres_url)
    yield engine
    engine.dispose()


def _rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(outbox_table)).scalar() or 0)


def _until(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


def _submit(engine: Engine) -> outbox.Staged:
    request = SubmitRequest(question="Q?", variant=get_variant("conductor-mini"))
    _, staged = stage_submission(engine, request)
    return staged


def test_staged_starts_go_out_once_each_after_the_broker_comes_back(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_relay, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(outbox_relay, "RETRY_MAX_S", 0.2)
    app = FlakyApp()
    app.down.set()
    relay = OutboxRelay(engine, app)  # type: ignore[arg-type]
    try:
        # Given three submissions committed while the broker refuses every message
        staged = [_submit(engine) for _ in range(3)]
        for item in staged:
            relay.put([item])  # returns at once
        _until(lambda: app.refused >= 3)
        # Then they wait in the outbox, and the relay tries again after pauses
        assert relay.pending == 3
        assert _rows(engine) == 3
        refused = app.refused
        time.sleep(0.5)
        assert refused < app.refused < refused + 12  # paused between tries, not spinning

        # When the broker answers again
        app.down.clear()
        _until(lambda: relay.pending == 0)
    finally:
        relay.close()

    # Then each start went out once, in order, and the outbox is empty
    assert app.sent == [(START_WORKFLOW_TASK, s.message.args) for s in staged]
    assert _rows(engine) == 0


def test_a_row_a_sweeper_is_sending_is_not_sent_by_the_relay(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (A row put less than FRESH_S ago is not a sweeper's to take: none is fresh here.)
    monkeypatch.setattr(outbox_relay, "FRESH_S", 0.0)
    app = FlakyApp()
    relay = OutboxRelay(engine, app)  # type: ignore[arg-type]
    try:
        # Given a staged start that a sweeper has taken (locked) and is sending
        staged = _submit(engine)
        with engine.begin() as sweeper:
            taken = outbox.take_stale(sweeper, utcnow() + timedelta(seconds=outbox.GRACE_S + 1))
            assert [t.id for t in taken] == [staged.id]
            # When the relay is given it meanwhile
            relay.put([staged])
            time.sleep(0.3)
            # Then it leaves it to the sweeper
            assert app.sent == []
            app.send_task(START_WORKFLOW_TASK, args=staged.message.args, queue="aggregator")
            outbox.forget(sweeper, [staged.id])
        # and once the sweeper has sent it, the relay forgets it without sending it again
        relay.put([])
        _until(lambda: relay.pending == 0)
    finally:
        relay.close()
    assert app.sent == [(START_WORKFLOW_TASK, staged.message.args)]
    assert _rows(engine) == 0


def test_many_staged_rows_go_out_in_batches(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_relay, "BATCH", 2)
    app = FlakyApp()
    relay = OutboxRelay(engine, app)  # type: ignore[arg-type]
    try:
        staged = [_submit(engine) for _ in range(5)]
        relay.put(staged)  # five at once: three transactions of at most two
        _until(lambda: relay.pending == 0)
    finally:
        relay.close()
    assert app.sent == [(START_WORKFLOW_TASK, s.message.args) for s in staged]
    assert _rows(engine) == 0
