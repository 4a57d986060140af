"""Checker processes: verifiers that may hang run here, under a hard time limit.

sympy (behind math-verify) can spend minutes inside C code that holds the GIL on
``\\boxed{9^{9^{9}}}``; no signal or thread interrupts that, only killing the process does.
A small pool of plain ``python -c`` children is home-made on purpose: multiprocessing's spawn and
forkserver (and so pebble, built on them) re-import the parent's main script in each child,
which re-runs a script without a ``__main__`` guard and re-imports a training script's torch;
fork is unsafe in a threaded parent.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import logging
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from conductor_evaluation.items import EvalItem, Verdict

CHECK_TIMEOUT_S = 10.0
CHECK_MEMORY_BYTES = 4 << 30  # per child: a runaway sympy expression fails instead of the host
CHECK_PROCESSES = 4
_STARTUP_TIMEOUT_S = 120.0


_CHILD = "import sys; from conductor_evaluation.checkers import serve; serve(int(sys.argv[1]))"


def serve(fd: int) -> None:
    """A checker process: ``check`` each (item, response) it is sent, reply with the Verdict,
    or with the exception when checking itself is broken."""
    with contextlib.suppress(Exception):  # Linux: die with the parent, even mid-computation
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = CHECK_MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(hard, CHECK_MEMORY_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": it is ours
    for module in ("math_verify", "reasoning_gym"):  # imported before, not during, a timed check
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    from conductor_evaluation.verify import check

    conn = Connection(fd)
    conn.send("ready")
    while True:
        try:
            item, response = conn.recv()
        except EOFError:  # the parent is gone
            return
        reply: Verdict | Exception
        try:
            reply = check(item, response)
        except Exception as e:
            reply = e
        try:
            conn.send(reply)
        except Exception as e:  # an exception that does not pickle
            conn.send(RuntimeError(f"{reply!r} ({e})"))


class _Checker:
    """One checker process, started on first use, killed and replaced when a check overruns.

    A plain ``python -c`` child, not multiprocessing's spawn: that re-imports the parent's main
    script (a training script: torch and all) and fails where it lacks a ``__main__`` guard.
    """

    def __init__(self) -> None:
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def run(self, item: EvalItem, response: str) -> Verdict:
        for _ in range(2):  # a death may be the host's doing (its OOM killer): try once more
            conn = self._conn or self._start()
            try:
                conn.send((item, response))
                reply = conn.recv() if conn.poll(CHECK_TIMEOUT_S) else None
            except (EOFError, OSError):  # it died: out of memory, or a crash in C code
                self.stop()
                continue
            if reply is None:
                self.stop()
                return Verdict(correct=False, detail=f"check timed out after {CHECK_TIMEOUT_S:g} s")
            if isinstance(reply, Verdict):
                return reply
            raise reply
        return Verdict(correct=False, detail="the checker process died on this response")

    def _start(self) -> Connection:
        ours, theirs = socket.socketpair()
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # some generators print; stdout may be a report
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        self._conn = conn = Connection(ours.detach())
        try:
            if conn.poll(_STARTUP_TIMEOUT_S) and conn.recv() == "ready":
                return conn
        except EOFError:
            pass
        self.stop()
        raise RuntimeError("the verifier's checker process did not start")

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        if self._conn is not None:
            self._conn.close()
        self._conn = self._process = None


class _Pool:
    """Checkers lent to an executor's threads, most recently used first, so only as many
    processes start as checks run at once."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.checkers = [_Checker() for _ in range(CHECK_PROCESSES)]
        self.idle: queue.LifoQueue[_Checker] = queue.LifoQueue()
        for checker in self.checkers:
            self.idle.put(checker)
        self.executor = ThreadPoolExecutor(CHECK_PROCESSES, thread_name_prefix="verify")

    def check(self, item: EvalItem, response: str) -> Verdict:
        checker = self.idle.get()
        try:
            return checker.run(item, response)
        finally:
            self.idle.put(checker)


_POOL = _Pool()  # processes start on first use
_POOL_LOCK = threading.Lock()


def checker_pool() -> _Pool:
    """This process's pool: a forked child has none of its parent's threads, and must not use
    (or at exit kill) its parent's checkers."""
    global _POOL
    with _POOL_LOCK:
        if _POOL.pid != os.getpid():
            _POOL = _Pool()  # processes start on first use
        return _POOL


@atexit.register
def _stop_checkers() -> None:
    if _POOL.pid == os.getpid():
        for checker in _POOL.checkers:
            checker.stop()


async def run_check(item: EvalItem, response: str) -> Verdict:
    """``verify.check(item, response)`` in a checker process, killed after CHECK_TIMEOUT_S."""
    import asyncio

    pool = checker_pool()
    return await asyncio.get_running_loop().run_in_executor(
        pool.executor, pool.check, item, response
    )
