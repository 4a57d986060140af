"""A client that loses the answer to a submission and retries it (issue 36, "also seen").

Without an Idempotency-Key the server cannot tell a retry from a second request for the same
question, which is a request of its own (a workflow's answer is not fixed: asking again is a
reason to ask), so it deduplicates nothing: two workflows. With a key made once per job and
sent on every try, the retry gets the first workflow back. The Python example of
docs/serving.md ("Retries and Idempotency-Key") is run as written, through the OpenAI SDK's
own retries after a timeout.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select

from conductor_adapters.store.keys import create_key
from conductor_adapters.store.models import workflow_table

from fakes.api_server import LiveApi, scripted_service
from fakes.scripted import ScriptedWorker

SERVING = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


class LosesFirstAnswer(httpx.BaseTransport):
    """Sends each request; the first submission's answer is lost on its way back (the client
    times out after the server accepted it)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.submissions: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/v1/workflows"):
            self.submissions.append(request.headers.get("Idempotency-Key"))
            if len(self.submissions) == 1:
                response.read()
                response.close()
                raise httpx.ReadTimeout("the answer was lost", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveApi, str]]:
    workers = [ScriptedWorker("alpha", answer=lambda _: "391"), ScriptedWorker("beta")]
    api = LiveApi(lambda: scripted_service(f"sqlite:///{tmp_path / 'c.db'}", workers))
    try:
        yield api, create_key(api.service.engine, "acme").secret
    finally:
        api.close()


def _workflows(api: LiveApi) -> int:
    with api.service.engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(workflow_table)).scalar()
    return int(count or 0)


def _client(api: LiveApi, key: str, transport: httpx.BaseTransport) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{api.url}/v1",
        api_key=key,
        http_client=httpx.Client(transport=transport),
    )


def _docs_example() -> str:
    section = SERVING.read_text().split("## Retries and Idempotency-Key", 1)[1]
    [block] = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.DOTALL)
    # The test's client (its transport loses an answer) stands in for the example's own.
    lines = block.splitlines()
    return "\n".join(line for line in lines if not line.startswith(("client = ", "from openai")))


def test_a_retry_with_the_docs_idempotency_key_gets_the_first_workflow(
    live: tuple[LiveApi, str],
) -> None:
    api, key = live
    transport = LosesFirstAnswer()
    scope: dict[str, Any] = {}
    with _client(api, key, transport) as client:
        scope["client"] = client
        exec(_docs_example(), scope)  # the docs' example, as written

    # The SDK sent it again after the lost answer, with the same key, and got the first
    # workflow back: one workflow runs
    assert len(transport.submissions) == 2
    assert transport.submissions[0] is not None
    assert transport.submissions[0] == transport.submissions[1]
    assert scope["job"]["status"] in {"queued", "running", "completed"}
    assert _workflows(api) == 1


def test_a_retry_without_a_key_is_a_second_workflow(live: tuple[LiveApi, str]) -> None:
    api, key = live
    transport = LosesFirstAnswer()
    with _client(api, key, transport) as client:
        client.post("/workflows", body={"question": "What is 17 * 23?"}, cast_to=object)

    # What the docs say: without a key, the SDK's retry is a request of its own
    assert transport.submissions == [None, None]
    assert _workflows(api) == 2
