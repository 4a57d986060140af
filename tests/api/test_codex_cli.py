"""The Codex CLI itself (npm's ``@openai/codex``), run as its users run it against the API: a
custom model provider on the Responses wire, ``codex exec`` with a task. Its first turn sends
its tools (functions, a namespace of sub-agent functions); the worker (or a variant's
answering step) asks for its shell; Codex runs the command and sends the output back; the
next turn answers with it, and Codex exits 0 with that answer."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fakes.api_fixture import Api
from fakes.servers import codex_binary

pytestmark = [pytest.mark.codex, pytest.mark.processes]

TASK = "list the files here"
CODEX_TIMEOUT_S = 120


def _config(api: Api) -> str:
    # web_search "disabled": no worker searches the web for a request, and the API refuses
    # the hosted tool rather than drop it (docs/serving.md says so, and the 400 says how).
    return "\n".join(
        [
            'model_provider = "conductor"',
            'web_search = "disabled"',
            "[model_providers.conductor]",
            'name = "Conductor"',
            f'base_url = "{api.url}/v1"',
            'env_key = "CONDUCTOR_API_KEY"',
            'wire_api = "responses"',
            "",
        ]
    )


def _run_codex(api: Api, model: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    binary = codex_binary()
    assert binary is not None, "the codex tier runs only where the Codex CLI is installed"
    home = tmp_path / "home"
    codex_home = home / ".codex"
    workspace = tmp_path / "workspace"
    codex_home.mkdir(parents=True)
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    (codex_home / "config.toml").write_text(_config(api))
    # A home of its own: Codex's shell sources ~/.bashrc, and writes its sessions and logs
    # under CODEX_HOME.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "CONDUCTOR_API_KEY": api.key,
    }
    command = [
        binary,
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m",
        model,
        TASK,
    ]
    return subprocess.run(
        command,
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CODEX_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize(("model", "answering"), [("alpha", "alpha"), ("conductor-ultra", "beta")])
def test_codex_completes_a_tool_calling_turn(
    api: Api, tmp_path: Path, model: str, answering: str
) -> None:
    worker = api.workers[answering]
    calls_before = len(worker.calls)

    # When Codex runs a task on the model
    done = _run_codex(api, model, tmp_path)

    # Then it exits 0 with the answer written after its command ran
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    assert f"{answering} read the tool's result" in done.stdout
    # the worker was offered Codex's own tools, its sub-agent namespace among them as plain
    # functions, asked for the shell, and read what the command printed as Codex ran it
    offered = [t.name for t in worker.tools_offered[-1].tools]
    assert "exec_command" in offered
    assert "multi_agent_v1__spawn_agent" in offered
    assert len(worker.calls) - calls_before == 2
    seen = "\n".join(m.content for m in worker.calls[-1].messages)
    assert "Process exited with code 127" in seen  # the example command is "Paris"
    # a workflow's progress is a reasoning item, which Codex shows in its log (each turn's)
    # and sends back with its history; a worker called directly has none
    plan = "Plan (round 1): 1. alpha: Solve it. 2. beta: Check it."
    assert done.stderr.count(plan) == (2 if model.startswith("conductor") else 0), done.stderr
