"""``conductor ask`` end to end, as a user runs it: a subprocess, the real model, a SQLite file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.protocol.validator import FALLBACK_SUBTASK

pytestmark = [pytest.mark.processes]

CONDUCTOR = [sys.executable, "-c", "from conductor_cli import main; main()"]


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "CONDUCTOR_DATABASE_URL": f"sqlite:///{tmp_path / 'traces.db'}",
        "CONDUCTOR_LLAMACPP_THREADS": "2",
        **env,
    }
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "CONDUCTOR_POOL_FILE"):
        if key not in env:
            environ.pop(key, None)
    return subprocess.run(
        [*CONDUCTOR, *args], capture_output=True, text=True, env=environ, timeout=240, check=False
    )


@pytest.mark.model
@pytest.mark.parametrize("variant", ["conductor-mini", "conductor-ultra"])
def test_ask_json_answers_with_the_model_s_plan_and_leaves_a_trace(
    tmp_path: Path, variant: str
) -> None:
    done = _run(["ask", "What is 12 + 30?", "--variant", variant, "--json"], tmp_path)

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["variant"] == variant
    assert out["answer"]
    assert out["plan"]
    assert {"worker", "subtask", "access_list"} <= set(out["plan"][0])
    first_call = out["planner_calls"][0]
    assert first_call["backend"] == "llamacpp"
    assert first_call["raw_output"]
    # The untrained model samples its plan; under the JSON schema it always fits the protocol,
    # and the one rule the schema cannot hold is "never copy an example's subtask" (it does now
    # and then): such a plan is refused and the question goes to the fallback as asked.
    assert out["plan_valid"] is first_call["valid"] is (not first_call["errors"])
    assert all("copied from the prompt's examples" in e for e in first_call["errors"])
    if not out["plan_valid"]:
        assert out["plan"][0]["subtask"] == FALLBACK_SUBTASK
    usage = out["usage"]
    conductor_tokens = sum(c["usage"]["total_tokens"] for c in out["planner_calls"])
    step_tokens = sum(s["usage"]["total_tokens"] for s in out["steps"])
    assert usage["total_tokens"] == conductor_tokens + step_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert out["cost_usd"] == 0.0
    assert out["latency_ms"] > 0

    db = sqlite3.connect(tmp_path / "traces.db")
    try:
        ((status, plan_valid, total_tokens, answer),) = db.execute(
            "SELECT status, plan_valid, total_tokens, answer FROM workflow WHERE id = ?",
            (out["workflow_id"].replace("-", ""),),
        ).fetchall()
        steps = db.execute("SELECT count(*) FROM step").fetchone()[0]
    finally:
        db.close()
    assert (status, plan_valid, total_tokens, answer) == (
        "completed",
        int(out["plan_valid"]),
        usage["total_tokens"],
        out["answer"],
    )
    assert steps == len(out["steps"])


@pytest.mark.model
def test_ask_prints_plan_steps_answer_and_totals(tmp_path: Path) -> None:
    done = _run(["ask", "Name a primary colour.", "--variant", "conductor-mini"], tmp_path)

    assert done.returncode == 0, done.stderr
    for needle in ("Pool", "Plan round 0", "Step 0", "tokens", "Answer", "trace"):
        assert needle in done.stdout, (needle, done.stdout)


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["ask", "   "], {}, "the question is empty"),
        (["ask", "hi", "--variant", "conductor-mega"], {}, "unknown variant 'conductor-mega'"),
        (["ask", "hi"], {"CONDUCTOR_LOCAL_MODEL": "/nowhere/model.gguf"}, "not found"),
        (["ask", "hi"], {"CONDUCTOR_POOL_FILE": "/nowhere/pool.yaml"}, "cannot read pool file"),
        (["ask", "hi"], {"CONDUCTOR_PLANNER_BACKEND": "vllm"}, "needs CONDUCTOR_PLANNER_MODEL"),
        (["ask", "hi"], {"CONDUCTOR_PLANNER_BACKEND": "gpt"}, "CONDUCTOR_PLANNER_BACKEND: Input"),
        (["ask", "hi"], {"CONDUCTOR_LLAMACPP_THREADS": "0"}, "CONDUCTOR_LLAMACPP_THREADS: Input"),
    ],
)
def test_bad_input_is_a_clear_error_not_a_traceback(
    tmp_path: Path, args: list[str], env: dict[str, str], needle: str
) -> None:
    done = _run(args, tmp_path, **env)

    assert done.returncode == 2
    assert needle in done.stderr
    assert "Traceback" not in done.stderr


def test_pool_lists_unavailable_workers_with_the_reason(tmp_path: Path) -> None:
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(
        "workers:\n"
        "  gemini:\n    provider: gemini\n    model: gemini-2.5-flash\n"
        "    api_key_env: GEMINI_API_KEY\n"
        "  claude:\n    provider: anthropic\n    model: claude-sonnet-4-5\n"
        "    api_key_env: CONDUCTOR_TEST_UNSET_KEY\n"
    )
    done = _run(
        ["pool", "--json"],
        tmp_path,
        GEMINI_API_KEY="g-test-key",
        CONDUCTOR_POOL_FILE=str(pool_file),
    )

    assert done.returncode == 0, done.stderr
    rows = {w["name"]: w for w in json.loads(done.stdout)["workers"]}
    assert rows["gemini"]["available"] is True
    assert rows["claude"]["available"] is False
    assert "CONDUCTOR_TEST_UNSET_KEY is not set" in rows["claude"]["reason"]
    assert "g-test-key" not in done.stdout


def test_gateway_without_a_broker_is_a_clear_error(tmp_path: Path) -> None:
    done = _run(["gateway"], tmp_path, CONDUCTOR_BROKER_URL="")

    assert done.returncode == 2
    assert "CONDUCTOR_BROKER_URL is not set" in done.stderr
    assert "Traceback" not in done.stderr


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    done = _run(["db", "upgrade"], tmp_path)

    assert done.returncode == 0, done.stderr
    db = sqlite3.connect(tmp_path / "traces.db")
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        db.close()
    assert {"workflow", "step", "attempt"} <= tables


@pytest.mark.model
def test_a_local_worker_on_a_gguf_path_the_user_names(tmp_path: Path) -> None:
    from conductor_adapters.llamacpp import smollm2_gguf_path

    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "workers:\n"
        "  my-gguf:\n"
        "    provider: llamacpp\n"
        f"    model: {smollm2_gguf_path()}\n"
        "    description: A local model from a file.\n"
        "    max_tokens: 48\n"
    )

    done = _run(
        ["ask", "Say hi.", "--variant", "conductor-mini", "--json"],
        tmp_path,
        CONDUCTOR_POOL_FILE=str(pool),
    )

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [s["worker"] for s in out["plan"]] == ["my-gguf"]
    assert out["steps"][0]["usage"]["completion_tokens"] <= 48
