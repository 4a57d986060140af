"""Run a fake provider as its own process: ``python -m fakes.serve openai --latency 1``.

Prints the base URL on its first line, then serves until stdin closes or it is terminated.
The request log is at ``GET /_fake/requests``. Used by benchmarks, which must not share a
process (and its GIL) with the server they measure.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from fakes.openai_server import FakeOpenAIServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("vendor", choices=["openai"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    args = parser.parse_args()
    server = FakeOpenAIServer(latency_s=args.latency)
    server.start(port=args.port)
    print(server.base_url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
