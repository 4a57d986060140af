"""The curl examples of docs/serving.md, run as written (with bash and the real curl) against a
live server; only the address differs: localhost:8000 becomes the test server's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from conductor_adapters.store.keys import create_key

from fakes.api_server import LiveApi, scripted_service
from fakes.scripted import ScriptedWorker

pytestmark = pytest.mark.processes  # bash and curl

SERVING = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def _bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveApi, str]]:
    database = tmp_path_factory.mktemp("docs") / "conductor.db"
    workers = [ScriptedWorker("alpha", answer=lambda _: "391"), ScriptedWorker("beta")]
    live = LiveApi(lambda: scripted_service(f"sqlite:///{database}", workers))
    try:
        yield live, create_key(live.service.engine, "docs").secret
    finally:
        live.close()


@pytest.mark.curl  # left out where curl is not installed (tests/fakes/servers.py)
def test_the_job_api_examples_run_as_written(server: tuple[LiveApi, str]) -> None:
    live, key = server
    assert shutil.which("curl"), "curl is needed: apt-get install curl"
    [block] = [b for b in _bash_blocks(SERVING.read_text()) if "/v1/workflows" in b]
    address = urlparse(live.url).netloc
    script = block.replace("localhost:8000", address)

    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={"PATH": "/usr/bin:/bin", "KEY": key},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "event: completed" in out  # the events stream ran to the end
    workflow = json.loads(next(line for line in out.splitlines() if '"object":"workflow"' in line))
    assert workflow["status"] == "completed"
    assert workflow["metadata"] == {"ticket": "T-1"}
    assert out.rstrip().endswith("}")
    assert json.loads(out.rstrip().splitlines()[-1])["score"] == 1


def test_a_body_sent_without_a_json_content_type_is_told_how_to_send_it(
    server: tuple[LiveApi, str],
) -> None:
    live, key = server
    with httpx.Client(base_url=live.url, timeout=10) as http:
        response = http.post(
            "/v1/workflows",
            content=b'{"question": "What is 17 * 23?"}',
            headers={
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/x-www-form-urlencoded",  # what curl -d sends
            },
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert "Content-Type: application/json" in error["message"]
    assert error["code"] == "unsupported_content_type"
