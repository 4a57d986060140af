"""A daemon thread that does one thing every few seconds until stopped (the aggregator's
deadline sweeper, its queue backlog reader)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Periodic:
    """Calls ``action`` every ``interval_s`` (first at once when ``at_start``); an action that
    raises is logged and tried again at the next interval."""

    def __init__(
        self, name: str, action: Callable[[], object], interval_s: float, *, at_start: bool = False
    ) -> None:
        self._action = action
        self._interval_s = interval_s
        self._at_start = at_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def _run(self) -> None:
        if self._at_start:
            self._act()
        while not self._stop.wait(self._interval_s):
            self._act()

    def _act(self) -> None:
        try:
            self._action()
        except Exception:  # the next interval tries again; the error is for the operator
            logger.exception("%s failed", self._thread.name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
