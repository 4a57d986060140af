"""Readers of a workflow's events are woken when new ones are stored, and never sleep through
an announcement that came before they waited."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import text

import conductor_api.service as service_module
from conductor_adapters.store.keys import create_key
from conductor_api.rules import Caller
from conductor_api.runtime import EventSignals

from fakes.api_server import LiveApi, scripted_service
from fakes.scripted import ScriptedWorker


async def _waited_s(signals: EventSignals, workflow_id: uuid.UUID, after: int) -> float:
    started = time.perf_counter()
    await signals.wait(workflow_id, after, timeout_s=1.0)
    return time.perf_counter() - started


async def test_a_reader_that_waits_after_the_final_announcement_returns_at_once() -> None:
    # Given a reader that read events 1-2, and the final event 3 announced before it waits
    signals = EventSignals()
    workflow_id = uuid.uuid4()
    signals.announce(workflow_id, 2)
    signals.announce(workflow_id, 3, final=True)

    # When it waits for what comes after 2, it returns at once, not at the 1 s poll
    assert await _waited_s(signals, workflow_id, after=2) < 0.1
    # ...while one that has read everything waits for the poll
    assert await _waited_s(signals, workflow_id, after=3) >= 0.9


async def test_a_waiting_reader_is_woken_by_the_next_announcement() -> None:
    signals = EventSignals()
    workflow_id = uuid.uuid4()
    waiting = asyncio.create_task(_waited_s(signals, workflow_id, after=0))
    await asyncio.sleep(0.05)
    signals.announce(workflow_id, 1)
    assert await waiting < 0.5


def test_finished_workflows_remembered_are_bounded() -> None:
    signals = EventSignals()
    ids = [uuid.uuid4() for _ in range(EventSignals.FINISHED_KEPT + 10)]
    for workflow_id in ids:
        signals.announce(workflow_id, 1, final=True)
    assert len(signals._finished) == EventSignals.FINISHED_KEPT
    assert ids[0] not in signals._finished
    assert ids[-1] in signals._finished


@pytest.mark.slow
def test_a_waiting_completion_reads_the_database_no_more_for_waiting_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the embedded API with a worker that answers in 0.5 s and one that takes 4 s, and a
    # spy on the reads of a workflow's events (the real reads run)
    workers = [ScriptedWorker("quick", delay_s=0.5), ScriptedWorker("slow", delay_s=4.0)]
    api = LiveApi(lambda: scripted_service(f"sqlite:///{tmp_path / 'conductor.db'}", workers))
    reads: list[int] = []
    real_load_events = service_module.load_events

    def load_events(engine: Any, workflow_id: uuid.UUID, tenant: str, after: int) -> Any:
        reads.append(after)
        return real_load_events(engine, workflow_id, tenant, after)

    monkeypatch.setattr(service_module, "load_events", load_events)

    def reads_for(worker: str) -> int:
        reads.clear()
        reply = client.chat.completions.create(
            model="conductor-ultra",
            messages=[{"role": "user", "content": "What is 6 * 7?"}],
            extra_body={"conductor": {"pool": [worker]}},
        )
        assert reply.choices[0].message.content
        return len(reads)

    try:
        key = create_key(api.service.engine, "acme").secret
        client = OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=30)
        # When the same one-step workflow runs on each
        quick, slow = reads_for("quick"), reads_for("slow")
    finally:
        api.close()

    # Then waiting 3.5 s longer costs no more reads (one more or less: how the first events
    # fall into reads varies): the waiting request is woken by each stored
    # event (re-reading every second made 500 waiting requests spend most of the CPU on reads)
    assert slow <= quick + 1, (quick, slow)


@pytest.mark.slow
def test_a_reader_waiting_for_the_outcome_asks_the_table_once_when_all_is_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the embedded API, whose every stored event is announced, a worker answering in
    # 0.5 s, and spies on the reads a waiting reader makes (the real reads run)
    workers = [ScriptedWorker("quick", delay_s=0.5)]
    api = LiveApi(lambda: scripted_service(f"sqlite:///{tmp_path / 'conductor.db'}", workers))
    reads: list[str] = []
    real = {
        name: getattr(service_module, name)
        for name in ("load_events", "outcome_passed", "outcome_stored")
    }

    def spy(name: str) -> Any:
        def read(*args: Any) -> Any:
            reads.append(name)
            return real[name](*args)

        return read

    for name in real:
        monkeypatch.setattr(service_module, name, spy(name))
    service = api.service

    async def wait_for_a_workflow() -> None:
        caller = Caller(tenant="acme")
        started = await service.start_workflow(caller, "What is 6 * 7?", pool=["quick"])
        # The reader every runtime shares (the embedded one would await its own task)
        await service.wait_for_stored_outcome(started.workflow_id, "acme")

    try:
        api.loop.run(wait_for_a_workflow())
    finally:
        api.close()
    # Then it asked once whether the outcome is stored, read no event, and was woken by
    # announcements for the rest (following the events re-read them after each announcement)
    assert reads == ["outcome_stored"]
    # And a reader of a workflow its own request submitted a moment ago (a chat completion's)
    # does not even ask that: the end's announcement says it
    reads.clear()

    async def wait_for_one_submitted_now() -> None:
        caller = Caller(tenant="acme")
        started = await service.start_workflow(caller, "What is 6 * 7?", pool=["quick"])
        await service.wait_for_stored_outcome(started.workflow_id, "acme", submitted_now=True)
        view = await service.read(started.workflow_id, "acme")
        assert view is not None
        assert view.status == "completed"

    api = LiveApi(lambda: scripted_service(f"sqlite:///{tmp_path / 'conductor.db'}", workers))
    service = api.service
    try:
        api.loop.run(wait_for_one_submitted_now())
    finally:
        api.close()
    assert reads == []


@pytest.mark.slow
def test_a_workflow_the_database_cannot_record_is_refused_and_its_run_stopped(
    tmp_path: Path,
) -> None:
    # Given the embedded API whose trace database refuses new workflows (their table is gone)
    worker = ScriptedWorker("quick", delay_s=2.0)
    api = LiveApi(
        lambda: scripted_service(f"sqlite:///{tmp_path / 'conductor.db'}", [worker]),
        open_access=True,
    )
    try:
        with api.service.engine.begin() as conn:
            conn.execute(text("ALTER TABLE workflow RENAME TO workflow_gone"))
        # When a chat completion asks for a workflow
        response = httpx.post(
            f"{api.url}/v1/chat/completions",
            json={"model": "conductor-ultra", "messages": [{"role": "user", "content": "Hi?"}]},
            timeout=30,
        )
        # Then it is refused as unavailable, not accepted, and the run begun beside the record
        # is stopped before its worker answers
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "database_unavailable"
        assert not api.service.runtime._running  # type: ignore[attr-defined]
        assert all(call.finished == 0.0 for call in worker.calls)
    finally:
        api.close()
