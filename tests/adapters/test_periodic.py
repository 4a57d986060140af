"""The periodic thread behind the aggregator's sweeper and backlog reader."""

from __future__ import annotations

import threading
import time

from conductor_adapters.periodic import Periodic


def test_it_acts_at_start_when_asked_and_carries_on_after_a_failure() -> None:
    calls: list[float] = []
    third = threading.Event()

    def act() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            third.set()
        if len(calls) == 1:
            raise RuntimeError("the broker is down")  # logged; the next interval tries again

    periodic = Periodic("test-periodic", act, 0.05, at_start=True).start()
    assert third.wait(5)
    periodic.stop()
    count = len(calls)
    time.sleep(0.2)
    assert len(calls) == count  # stopped: no call after stop() returned


def test_without_at_start_the_first_call_waits_one_interval() -> None:
    calls: list[float] = []
    started = time.monotonic()
    periodic = Periodic("test-periodic", lambda: calls.append(time.monotonic()), 0.3).start()
    time.sleep(0.1)
    assert calls == []
    time.sleep(0.4)
    periodic.stop()
    assert calls
    assert calls[0] - started >= 0.3
