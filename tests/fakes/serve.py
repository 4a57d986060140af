"""Run a fake provider as its own process: ``python -m fakes.serve openai --latency 1``.

Prints the base URL on its first line, then serves until stdin closes or it is terminated.
The request log is at ``GET /_fake/requests``. Used by benchmarks, which must not share a
process (and its GIL) with the server they measure. ``--responder plans`` makes it a Conductor:
it answers a plan in the paper's list form, of N chained steps on Model 0 when the question
says ``[N steps]`` (else one).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from typing import Any

from fakes.openai_server import FakeOpenAIServer, echo_responder

_STEPS = re.compile(r"\[(\d) steps?\]")


def plan_responder(messages: list[dict[str, Any]]) -> str:
    """A Conductor writing N chained steps on Model 0, N from ``[N steps]`` in the prompt."""
    asked = "\n".join(str(m.get("content", "")) for m in messages)
    found = _STEPS.search(asked)
    steps = int(found.group(1)) if found else 1
    subtasks = ", ".join(f'"Step {n + 1}."' for n in range(steps))
    access = ", ".join("[]" if n == 0 else f"[{n - 1}]" for n in range(steps))
    return f"Chained.\nmodel_id = {[0] * steps}\nsubtasks = [{subtasks}]\naccess_list = [{access}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("vendor", choices=["openai"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    parser.add_argument(
        "--word-delay", type=float, default=0.0, help="seconds between a streamed answer's words"
    )
    parser.add_argument("--responder", choices=["echo", "plans"], default="echo")
    args = parser.parse_args()
    responder = plan_responder if args.responder == "plans" else echo_responder
    server = FakeOpenAIServer(
        responder=responder, latency_s=args.latency, word_delay_s=args.word_delay
    )
    server.start(port=args.port)
    print(server.base_url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
