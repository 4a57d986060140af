"""``GET /v1/stats``: a tenant's workflows added up over a span, on both runtimes."""

from __future__ import annotations

import time
from typing import Any

import httpx

from fakes.api_fixture import Api


def _job(http: httpx.Client, **fields: Any) -> str:
    reply = http.post("/v1/workflows", json={"question": "What is 6 * 7?", **fields})
    assert reply.status_code == 202, reply.text
    return str(reply.json()["id"])


def _wait_ended(http: httpx.Client, ids: list[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        statuses = {http.get(f"/v1/workflows/{i}").json()["status"] for i in ids}
        if statuses <= {"completed", "failed", "cancelled"}:
            return
        time.sleep(0.1)
    raise AssertionError(f"workflows still running: {statuses}")


def test_stats_add_up_a_tenants_workflows_by_variant_worker_and_failure(api: Api) -> None:
    # Given two ultra jobs and a mini job that complete, and one whose only worker is down
    with api.http() as http, api.http(api.delta_key) as failing, api.http(api.other_key) as other:
        ids = [_job(http), _job(http), _job(http, variant="conductor-mini")]
        ids.append(_job(failing))
        _wait_ended(http, ids)
        views = [http.get(f"/v1/workflows/{i}").json() for i in ids]

        # When the tenant, and another, read the stats of the last hour by hour
        window = {"created_after": int(time.time()) - 3600, "bucket": "hour"}
        mine = http.get("/v1/stats", params=window).json()
        theirs = other.get("/v1/stats", params=window).json()
        refused = http.get("/v1/stats", params={"created_after": "2999-01-01T00:00:00Z"})
        too_long = http.get("/v1/stats", params={"created_after": "2020-01-01T00:00:00Z"})
        too_early = http.get("/v1/stats", params={"created_before": "0001-01-02T00:00:00Z"})

    # Then the totals, series and failure reasons are those of these workflows (at least:
    # the module's other tests share the tenant), and another tenant's are not in them
    totals = mine["totals"]
    assert totals["workflows"] >= 4
    assert totals["completed"] >= 3
    assert totals["failed"] >= 1
    assert totals["tokens"] >= sum(v["usage"]["total_tokens"] for v in views)
    assert 0 < totals["valid_plan_rate"] <= 1
    assert 0 < totals["latency_ms_p50"] <= totals["latency_ms_p95"]
    by_variant = {e["variant"]: e["workflows"] for e in mine["by_variant"]}
    assert by_variant["conductor-ultra"] >= 3
    assert by_variant["conductor-mini"] >= 1
    workers = {e["worker"] for e in mine["by_worker"]}
    assert {"alpha", "beta", "delta"} <= workers
    [reason] = [r for r in mine["failure_reasons"] if "delta" in r["reason"]]
    assert "10.20.30.40" not in reason["reason"]  # internal addresses stay in the trace
    assert theirs["totals"]["workflows"] == 0
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "created_after"
    assert too_long.status_code == 400
    assert "at most 400 days" in too_long.json()["error"]["message"]
    assert too_early.status_code == 400
