"""How long the trace viewer's workflows list takes to load with 10,000 workflows stored.

A fresh SQLite database gets ``--workflows`` finished workflows (in one transaction, as the
trace writes store them: a row each, with usage, cost and labels), ``conductor serve`` runs on
it (open local mode: no key), and Debian's chromium, driven by Playwright, opens ``/ui/`` in a
new browser context each run (nothing cached) and waits until the list's rows are drawn. The
time from navigation to the last row drawn is the figure; the JSON page the list asks for is
timed on its own too, so that server and browser shares show.

    python benchmarks/ui_list.py [--workflows 10000] [--runs 5]

Prints each run, then the median and the largest, against the 1 s target.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright
from sqlalchemy import insert

from conductor_adapters.store.db import make_engine, upgrade
from conductor_adapters.store.models import new_workflow_values, workflow_table

TARGET_S = 1.0
VARIANTS = ("conductor-ultra", "conductor-mini")
STATUSES = ("completed", "completed", "completed", "failed")


def seed(database_url: str, count: int) -> None:
    """``count`` finished workflows over the last 30 days, in one transaction."""
    upgrade(database_url)
    engine = make_engine(database_url)
    rng = random.Random(7)
    now = datetime.now(UTC)
    rows = []
    for n in range(count):
        created = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
        values = new_workflow_values(
            uuid.uuid4(),
            tenant="default",
            variant=rng.choice(VARIANTS),
            question=f"Question {n}: what is {rng.randint(2, 99)} * {rng.randint(2, 99)}?",
            status=rng.choice(STATUSES),
            created_at=created,
            labels={"batch": f"b{n % 20}"},
        )
        tokens = rng.randint(200, 4000)
        values.update(
            total_tokens=tokens,
            prompt_tokens=tokens * 3 // 4,
            completion_tokens=tokens // 4,
            cost_usd=tokens * 2e-6,
            latency_ms=rng.uniform(300, 9000),
            finished_at=created + timedelta(seconds=5),
            plan_valid=True,
        )
        rows.append(values)
    with engine.begin() as conn:
        conn.execute(insert(workflow_table), rows)
    engine.dispose()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(database_url: str, home: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "CONDUCTOR_DATABASE_URL": database_url,
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
    }
    command = ["conductor", "serve", "--port", str(port), "--grpc-port", "-1"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"conductor serve exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("conductor serve did not answer within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is needed: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        database_url = f"sqlite:///{home / 'conductor.db'}"
        started = time.perf_counter()
        seed(database_url, args.workflows)
        print(f"seeded {args.workflows} workflows in {time.perf_counter() - started:.1f} s")
        process, url = serve(database_url, home)
        try:
            page_api = []
            for _ in range(args.runs):
                clock = time.perf_counter()
                reply = httpx.get(f"{url}/v1/workflows", params={"limit": 50}, timeout=30)
                page_api.append(time.perf_counter() - clock)
                assert reply.status_code == 200, reply.text
            loads = []
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=chromium, args=["--no-sandbox"]
                )
                for run in range(1, args.runs + 1):
                    context = browser.new_context()  # nothing cached between runs
                    page = context.new_page()
                    clock = time.perf_counter()
                    page.goto(f"{url}/ui/")
                    page.locator("#workflow-table tr[data-workflow-id]").first.wait_for()
                    rows = page.locator("#workflow-table tr[data-workflow-id]").count()
                    loads.append(time.perf_counter() - clock)
                    print(f"run {run}: list drawn ({rows} rows) in {loads[-1] * 1000:.0f} ms")
                    context.close()
                browser.close()
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(
        f"JSON page of 50 (server only): median {statistics.median(page_api) * 1000:.0f} ms, "
        f"max {max(page_api) * 1000:.0f} ms"
    )
    median, worst = statistics.median(loads), max(loads)
    verdict = "under" if worst < TARGET_S else "OVER"
    print(
        f"list page with {args.workflows} workflows: median {median * 1000:.0f} ms, "
        f"max {worst * 1000:.0f} ms ({verdict} the {TARGET_S:g} s target)"
    )
    sys.exit(0 if worst < TARGET_S else 1)


if __name__ == "__main__":
    main()
