"""Fairness between tenants on a shared worker, on both runtimes: one tenant's hundred jobs
waiting on a worker that takes two calls at once do not make another tenant's job wait behind
them. The quota stores' own rules (fair order, cancelled and dead waiters) are tested in
tests/gateway/test_quotas.py; this is the whole path: HTTP job API, workflow, gateway."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fakes.api_fixture import NARROW_S, Api

# A hundred jobs through a worker taking two calls at once: seconds of waiting, on both runtimes.
pytestmark = [pytest.mark.slow]

BUSY_JOBS = 100


def _submit(http: httpx.Client, question: str) -> str:
    response = http.post("/v1/workflows", json={"question": question, "pool": ["narrow"]})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _none_queued(http: httpx.Client) -> bool:
    """Whether every job of the key's tenant has started (its step is on its way)."""
    listed = http.get("/v1/workflows", params={"status": "queued", "limit": 1})
    assert listed.status_code == 200, listed.text
    return not listed.json()["data"]


def _call_started(api: Api, marker: str, timeout_s: float) -> float | None:
    """When (perf_counter) narrow began the call whose question holds ``marker``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for call in list(api.workers["narrow"].calls):
            if any(marker in m.content for m in call.messages):
                return call.started
        time.sleep(0.02)
    return None


def test_another_tenants_job_starts_within_two_calls_of_a_busy_shared_worker(api: Api) -> None:
    narrow = api.workers["narrow"]
    with api.http() as busy, api.http(api.other_key) as other:
        # Given tenant acme's 100 jobs on narrow (2 calls at once, 1.5 s each), its calls
        # running and the rest of them waiting for the worker
        busy_ids = [_submit(busy, f"acme job {i}: what is {i} + 1?") for i in range(BUSY_JOBS)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (len(narrow.calls) >= 2 and _none_queued(busy)):
            time.sleep(0.1)
        assert _none_queued(busy), "acme's jobs did not all start"
        waiting = BUSY_JOBS - len(narrow.calls)
        try:
            # When tenant globex submits one job to the same worker
            submitted = time.perf_counter()
            _submit(other, "globex job: what is 2 + 2?")

            # Then its call starts within two of narrow's call durations, while acme's jobs
            # still wait (without fair turns it would queue behind them: about 70 s)
            started = _call_started(api, "globex job", timeout_s=4 * NARROW_S)
            assert started is not None, "globex's call did not start within 4 call durations"
            assert started - submitted <= 2 * NARROW_S, started - submitted
            assert waiting > BUSY_JOBS / 2, waiting
        finally:
            with ThreadPoolExecutor(8) as pool:  # acme's jobs would hold narrow for a minute
                cancels = list(pool.map(lambda i: _cancel(api, i), busy_ids))
    assert set(cancels) == {200}


def _cancel(api: Api, workflow_id: str) -> int:
    with api.http() as http:  # one client per thread
        return http.post(f"/v1/workflows/{workflow_id}/cancel").status_code
