"""The distributed API's readiness: what takes a replica out of its Service, and what does not."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy import create_engine

from conductor_adapters.settings import BrokerSettings, Settings
from conductor_api.app import create_app
from conductor_cli.local_stack import free_port
from conductor_cli.wiring import distributed_api_service


async def _readyz(postgres_url: str, redis_url: str, prefix: str) -> httpx.Response:
    """/readyz of the distributed API on these servers, with no planner listening."""
    settings = Settings(database_url=postgres_url, planner_addr=f"127.0.0.1:{free_port()}")
    broker = BrokerSettings(broker_url=redis_url, redis_url=redis_url, redis_prefix=prefix)
    engine = create_engine(postgres_url)
    service = distributed_api_service(settings, broker, engine)
    await service.start()
    try:
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            return await http.get("/readyz")
    finally:
        await service.aclose()
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.broker
async def test_a_planner_outage_is_reported_but_keeps_the_api_ready(
    postgres_url: str, redis_url: str
) -> None:
    # Given the distributed API with its database, broker and Redis, and no planner listening
    # When a probe asks whether it is ready
    reply = await _readyz(postgres_url, redis_url, f"readyz-{uuid.uuid4().hex}:")

    # Then it is: every replica shares the planner, so taking them all out of the Service
    # would only turn the API's clear errors into refused connections
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["status"] == "ready"
    assert body["database"] == body["broker"] == body["redis"] == "ok"
    assert body["planner"].startswith(("unreachable", "no answer")), body


@pytest.mark.postgres
@pytest.mark.broker
async def test_an_unreachable_broker_makes_the_api_not_ready(postgres_url: str) -> None:
    # Given the distributed API whose broker and Redis cannot be reached
    reply = await _readyz(postgres_url, f"redis://127.0.0.1:{free_port()}/0", "readyz:")

    # Then it is not ready, and says which dependency failed
    assert reply.status_code == 503, reply.text
    body = reply.json()
    assert body["status"] == "not ready"
    assert body["database"] == "ok"
    assert body["broker"] != "ok"
    assert body["redis"] != "ok"
