"""Where the distributed stack's CPU goes: one-step workflows at 50 in flight through
``conductor api`` and the local stack (planner, one aggregator, one gateway; Redis broker,
PostgreSQL), the CPU of each role's process per workflow, and with ``--profile DIR`` a py-spy
profile of each role under that load (samples taken only while a thread holds the GIL, which
is close to where the CPU goes; folded stacks, one file per role, for speedscope or
flamegraph.pl).

The same fakes and stack as orchestration_overhead.py's distributed target. CPU per role on a
shared 2-core machine drifts by 10-20% between runs: compare commits by running this on each,
alternating, several times.

    python benchmarks/distributed_roles.py [--workflows 500] [--in-flight 50] [--steps 1]
        [--pass-through 0] [--profile DIR] [--postgres URL] [--redis URL]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from orchestration_overhead import (  # noqa: E402
    QUESTION,
    FakeUpstream,
    Target,
    Upstreams,
    chat_body,
    distributed_target,
    measure,
    process_tree_cpu_s,
    workflow_body,
)

from conductor_adapters.http_wire import new_client  # noqa: E402

WARM_UP = 20
PROFILE_RATE_HZ = 200


def role_of(pid: int) -> str:
    """The role a stack process runs (``conductor ROLE ...``), from its command line."""
    words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    for role in ("planner", "aggregator", "gateway", "api"):
        if role.encode() in words:
            return role
    return str(pid)


def start_profiles(target: Target, out: Path) -> list[subprocess.Popen[bytes]]:
    if shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    out.mkdir(parents=True, exist_ok=True)
    command = ["py-spy", "record", "--gil", "--nonblocking", "--format", "raw"]
    command += ["--rate", str(PROFILE_RATE_HZ)]
    return [
        subprocess.Popen(
            [*command, "--pid", str(pid), "-o", str(out / f"{role_of(pid)}.folded")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid in target.pids
    ]


async def run(target: Target, options: argparse.Namespace) -> None:
    body = workflow_body(options.steps, "fast")
    async with new_client() as client:
        if options.pass_through:  # what orchestration_overhead.py runs before the workflows
            phase = await measure(
                client, target, "pass-through", "in-flight", chat_body("fast", QUESTION),
                concurrency=options.in_flight, requests=options.pass_through,
            )  # fmt: skip
            print(f"pass-through: {phase.server_cpu_ms_per_request:.2f} ms of CPU per call")
        for _ in range(WARM_UP):
            await client.post(target.completions_url, json=body, headers=target.headers)
        profiles = start_profiles(target, options.profile) if options.profile else []
        if profiles:
            await asyncio.sleep(2)  # py-spy attaches
        before = {pid: process_tree_cpu_s([pid]) for pid in target.pids}
        phase = await measure(
            client, target, f"{options.steps}-step workflow", "in-flight", body,
            concurrency=options.in_flight, requests=options.workflows,
        )  # fmt: skip
        after = {pid: process_tree_cpu_s([pid]) for pid in target.pids}
        for profile in profiles:
            profile.send_signal(signal.SIGINT)
        for profile in profiles:
            profile.wait(timeout=120)
    served = phase.requests
    print(
        f"{served} {options.steps}-step workflows at {options.in_flight} in flight: "
        f"{phase.throughput:.1f}/s, {phase.failures} failed, "
        f"{phase.server_cpu_ms_per_request:.2f} ms of CPU per workflow"
    )
    for pid in target.pids:
        cpu_ms = (after[pid] - before[pid]) * 1000 / served if served else 0.0
        print(f"  {role_of(pid):<11} {cpu_ms:7.2f} ms")
    if options.profile:
        print(f"profiles (folded stacks) in {options.profile}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=50)
    parser.add_argument("--steps", type=int, default=1, choices=range(1, 6))
    parser.add_argument("--pass-through", type=int, default=0, help="pass-through calls sent first")
    parser.add_argument("--profile", type=Path, help="write a py-spy profile per role here")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    options = parser.parse_args()
    upstreams = Upstreams(
        FakeUpstream(),
        FakeUpstream("--latency", "1"),
        FakeUpstream("--responder", "plans"),
        FakeUpstream("--word-delay", "0.1"),
    )
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            distributed_target(Path(tmp), upstreams, options.postgres, options.redis) as target,
        ):
            asyncio.run(run(target, options))
    finally:
        upstreams.stop()


if __name__ == "__main__":
    main()
