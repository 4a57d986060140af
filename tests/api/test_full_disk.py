"""``conductor serve`` (the embedded runtime) on a disk that fills up and frees again (issue 36
#10): workflows whose provider calls were answered while every write failed end completed in
the trace once space returns, without a restart, and readiness says writes fail meanwhile.

The disk is a tmpfs of a few MiB mounted for the test, filled with a file until the kernel
answers ENOSPC, and freed by deleting it: SQLite then meets the real error (SQLITE_FULL from a
write or fsync of its WAL) rather than an imitation. Mounting needs root (CAP_SYS_ADMIN); a
loop-mounted image would too, and an RLIMIT_FSIZE limit gives EFBIG and a signal instead of
ENOSPC, in a subprocess of its own. Where no tmpfs can be mounted, the test says so and is
skipped.
"""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conductor_adapters.store.keys import create_key

from fakes.api_server import LiveApi, scripted_service
from fakes.scripted import ScriptedWorker

pytestmark = [pytest.mark.processes]  # mount and umount

WORKFLOWS = 3
CALL_S = 0.8  # each worker call: long enough to fill the disk while they run


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(disk: Path) -> Path:
    """A file that takes every free byte of ``disk``, until the kernel says ENOSPC."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:
        for size in (65536, 1):  # then the last few bytes
            refused: int | None = None
            while refused is None:
                try:
                    out.write(b"\0" * size)
                except OSError as exc:
                    refused = exc.errno
            assert refused == errno.ENOSPC, refused
    return filler


def test_workflows_that_end_while_the_disk_is_full_are_stored_once_it_frees(
    small_disk: Path,
) -> None:
    workers = [ScriptedWorker("alpha", delay_s=CALL_S), ScriptedWorker("beta", delay_s=CALL_S)]
    api = LiveApi(lambda: scripted_service(f"sqlite:///{small_disk / 'conductor.db'}", workers))
    try:
        key = create_key(api.service.engine, "acme").secret
        client = httpx.Client(
            base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        ids = []
        for _ in range(WORKFLOWS):
            accepted = client.post("/v1/workflows", json={"question": "What is 6*7?"})
            assert accepted.status_code == 202, accepted.text
            ids.append(accepted.json()["id"])
        filler = _fill(small_disk)

        # Each workflow calls alpha, then beta; every call is answered while the disk is full.
        deadline = time.monotonic() + 30
        while sum(len(w.calls) for w in workers) < 2 * WORKFLOWS or any(
            c.finished == 0 for w in workers for c in w.calls
        ):
            assert time.monotonic() < deadline, "the workers were not called in 30 s"
            time.sleep(0.05)
        # Readiness: the database answers reads, but no write goes through.
        deadline = time.monotonic() + 10
        while (ready := client.get("/readyz")).status_code == 200:
            assert time.monotonic() < deadline, f"still ready with a full disk: {ready.text}"
            time.sleep(0.1)
        assert ready.status_code == 503, ready.text
        assert "writes failing" in ready.json()["database"], ready.text
        statuses = {client.get(f"/v1/workflows/{i}").json()["status"] for i in ids}
        assert statuses <= {"queued", "running"}, statuses  # what the full disk left in the trace

        # Space returns: without a restart, every workflow ends completed in the trace.
        filler.unlink()
        deadline = time.monotonic() + 30
        while True:
            views = [client.get(f"/v1/workflows/{i}").json() for i in ids]
            if all(v["status"] == "completed" for v in views):
                break
            assert time.monotonic() < deadline, [(v["status"], v.get("error")) for v in views]
            time.sleep(0.2)
        assert all(len(v["steps"]) == 2 for v in views), views
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        client.close()
    finally:
        api.close()
