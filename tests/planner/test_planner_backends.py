"""The transformers and vLLM planner backends.

transformers: the built-in SmolLM2 GGUF (marked ``model``), a tiny random checkpoint saved with
save_pretrained, micro-batching (fewer model calls than requests, answers identical to one at a
time, per-request max_tokens, one temperature per batch, one model call at a time), closing.
vLLM cannot run here (no GPU, not installed): its import guard, GPU check, structured-output
feature detection and request mapping are tested against stand-ins.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conductor.chat import ChatMessage, Completion
from conductor.errors import ConductorError, ConfigurationError, ModelNotFoundError
from conductor.ports import PlanFormat, PlanRequest, PromptForm
from conductor.protocol import fallback_plan, render_prompt
from conductor.workflow import PlanOutcome, PoolEntry
from conductor_adapters.llamacpp import smollm2_gguf_path
from conductor_adapters.settings import Settings, default_cache_dir
from conductor_planner import ConductorPlanner
from conductor_planner.backends import create_backend
from conductor_planner.backends.transformers import (
    TransformersPlannerBackend,
    load_transformers_backend,
    prompt_token_ids,
    resolve_model,
)
from conductor_planner.backends.vllm import (
    VLLMPlannerBackend,
    structured_output_kwargs,
)
from conductor_planner.models import COMPLETE_MARKER

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

POOL = [
    PoolEntry(name="local", description="A small local model for simple subtasks."),
    PoolEntry(name="math", description="A strong mathematician."),
    PoolEntry(name="coder", description="An expert Python programmer."),
]
TRANSFORMERS_HINT = r"pip install 'conductor-orchestrator\[transformers\]'"
VLLM_HINT = r"pip install 'conductor-orchestrator\[vllm\]'"


def _require_extra() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:  # fail, never skip: CI must install the extra
        pytest.fail(
            f"these tests need the transformers extra ({exc}): pip install -e '.[transformers]'",
            pytrace=False,
        )


def _ask(content: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content="You are the Conductor."),
        ChatMessage(role="user", content=content),
    ]


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tokenizer() -> PreTrainedTokenizerBase:
    """A ChatML tokenizer (SmolLM2's chat format) of 259 byte tokens: loads in milliseconds,
    where SmolLM2's own takes tens of seconds to read from its GGUF."""
    _require_extra()
    from fakes.tiny_model import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer Llama, as save_pretrained writes a trained Conductor
    (fixed seed: its greedy answers are the same on every run)."""
    _require_extra()
    from fakes.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-conductor"))


@pytest.fixture(scope="module")
def tiny_backend(tiny_checkpoint: Path) -> Iterator[TransformersPlannerBackend]:
    """One backend for the batching tests; each test runs on its own event loop."""
    backend = load_transformers_backend(str(tiny_checkpoint), device="cpu", max_batch_size=4)
    yield backend
    asyncio.run(backend.aclose())


@dataclass
class GenerateCalls:
    """What reached ``model.generate``: batch size and sampling of each call, overlap."""

    sizes: list[int] = field(default_factory=list)
    sampling: list[tuple[bool, float | None]] = field(default_factory=list)
    running: int = 0
    most_running: int = 0
    started: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def generate_calls(
    tiny_backend: TransformersPlannerBackend, monkeypatch: pytest.MonkeyPatch
) -> GenerateCalls:
    return _count_generate_calls(tiny_backend, monkeypatch)


def _count_generate_calls(
    backend: TransformersPlannerBackend, monkeypatch: pytest.MonkeyPatch
) -> GenerateCalls:
    calls = GenerateCalls()
    model = backend.model
    real_generate = model.generate

    def counting_generate(*args: Any, **kwargs: Any) -> Any:
        config = kwargs["generation_config"]
        with calls.lock:
            calls.sizes.append(int(kwargs["input_ids"].shape[0]))
            calls.sampling.append((config.do_sample, config.temperature))
            calls.running += 1
            calls.most_running = max(calls.most_running, calls.running)
        calls.started.set()
        try:
            return real_generate(*args, **kwargs)
        finally:
            with calls.lock:
                calls.running -= 1

    monkeypatch.setattr(model, "generate", counting_generate)
    return calls


# -- transformers: the built-in GGUF model ---------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_backend() -> Iterator[tuple[TransformersPlannerBackend, float]]:
    """The default transformers backend (builtin:smollm2, dequantised) and its load time."""
    _require_extra()
    started = time.perf_counter()
    backend = create_backend(Settings(planner_backend="transformers", planner_model=None))
    load_s = time.perf_counter() - started
    assert isinstance(backend, TransformersPlannerBackend)
    yield backend, load_s
    asyncio.run(backend.aclose())


@pytest.mark.model
async def test_the_builtin_gguf_model_plans_through_the_conductor_planner(
    smollm2_backend: tuple[TransformersPlannerBackend, float],
) -> None:
    backend, load_s = smollm2_backend
    print(f"\nbuiltin:smollm2 on transformers: loaded in {load_s:.1f} s")
    assert load_s < 180
    assert backend.plan_format is PlanFormat.LISTS
    assert backend.model_name.endswith(".gguf")
    assert backend.device.type in ("cpu", "cuda")
    # The dequantised weights are kept, so the next load of the same file takes seconds.
    assert list((default_cache_dir() / "transformers").glob(f"*/{COMPLETE_MARKER}"))
    planner = ConductorPlanner(backend)
    questions = [
        "What is 17 * 23?",
        "Write a Python function that reverses a string, then test it on three examples.",
    ]

    # Two plans at once: one batch (prompts of different lengths, left-padded).
    started = time.perf_counter()
    outcomes = await asyncio.gather(
        *(
            planner.plan(
                PlanRequest(question=q, pool=POOL, max_steps=3, temperature=0.0, max_tokens=48)
            )
            for q in questions
        )
    )
    print(f"two concurrent plans in {time.perf_counter() - started:.1f} s")
    assert backend.stats.batches == 1
    assert backend.stats.requests == 2
    for outcome in outcomes:
        assert isinstance(outcome, PlanOutcome)
        assert outcome.backend == "transformers"
        assert outcome.raw_output.strip()
        assert outcome.usage.prompt_tokens > 500  # the prompt with its four examples
        assert 0 < outcome.usage.completion_tokens <= 48
        assert outcome.valid == (not outcome.errors)  # a 135M model may well write no plan
        assert 1 <= len(outcome.plan.steps) <= 3
        assert outcome.latency_ms > 0
    assert outcomes[0].usage.prompt_tokens < outcomes[1].usage.prompt_tokens


# -- transformers: a checkpoint directory ----------------------------------------------------


async def test_a_saved_checkpoint_directory_loads_in_seconds_and_answers(
    tiny_checkpoint: Path,
) -> None:
    started = time.perf_counter()
    backend = create_backend(
        Settings(
            planner_backend="transformers",
            planner_model=str(tiny_checkpoint),
            planner_device="cpu",
            planner_max_batch_size=3,
        )
    )
    load_s = time.perf_counter() - started
    print(f"\ntiny checkpoint directory loaded in {load_s:.2f} s")
    assert load_s < 15
    assert isinstance(backend, TransformersPlannerBackend)
    assert backend.name == "transformers"
    assert backend.model_name == tiny_checkpoint.name
    assert backend.max_batch_size == 3
    assert str(backend.device) == "cpu"
    assert str(backend.model.dtype) == "torch.float32"
    completion = await backend.generate(
        _ask("Plan: what is 2 + 2?"), json_schema=None, max_tokens=5, temperature=0.0
    )
    assert isinstance(completion, Completion)
    assert completion.model == tiny_checkpoint.name
    assert completion.usage.prompt_tokens == len(
        prompt_token_ids(backend.tokenizer, _ask("Plan: what is 2 + 2?"))
    )
    assert 0 < completion.usage.completion_tokens <= 5
    assert completion.finish_reason in ("stop", "length")
    await backend.aclose()


def test_the_prompt_is_the_chat_template_with_the_generation_prompt(
    chat_tokenizer: PreTrainedTokenizerBase,
) -> None:
    ids = prompt_token_ids(chat_tokenizer, _ask("Hello"))
    text = chat_tokenizer.decode(ids)
    assert isinstance(text, str)
    assert text.count("<|im_start|>") == 3  # system, user, and the assistant turn to write
    assert text.endswith("<|im_start|>assistant\n")
    assert "You are the Conductor." in text
    assert "Hello" in text


@pytest.mark.parametrize("form", list(PromptForm))
async def test_the_planner_sends_the_prompt_form_its_backend_was_trained_on(
    form: PromptForm,
) -> None:
    from fakes.scripted import ScriptedBackend, lists

    backend = ScriptedBackend([lists([0], ["Solve it."], [[]])], prompt_form=form)
    request = PlanRequest(question="q", pool=[PoolEntry(name="a", description="any")], max_steps=5)
    outcome = await ConductorPlanner(backend).plan(request)
    assert outcome.valid
    system = backend.requests[0]["messages"][0].content
    assert system == render_prompt(request, PlanFormat.LISTS, form=form)[0].content
    assert ("Example 1" in system) is (form is PromptForm.FULL)


@pytest.mark.parametrize("form", list(PromptForm))
async def test_a_json_plan_carries_reasoning_in_every_form_but_the_minimal_one(
    form: PromptForm,
) -> None:
    from fakes.scripted import ScriptedBackend

    steps = '"steps": [{"model_id": 0, "subtask": "Solve it.", "access_list": []}]'
    output = (
        "{" + steps + "}" if form is PromptForm.MINIMAL else '{"reasoning": "r", ' + steps + "}"
    )
    backend = ScriptedBackend([output], plan_format=PlanFormat.JSON, prompt_form=form)
    request = PlanRequest(question="q", pool=[PoolEntry(name="a", description="any")], max_steps=5)
    outcome = await ConductorPlanner(backend).plan(request)
    assert outcome.valid, outcome.errors
    schema = backend.requests[0]["json_schema"]
    assert ("reasoning" in schema["properties"]) is form.reasoning
    assert schema["required"] == (["reasoning", "steps"] if form.reasoning else ["steps"])


async def test_a_plan_that_copies_an_example_subtask_falls_back_to_the_question_as_asked() -> None:
    from conductor.protocol.examples import EXAMPLES

    from fakes.scripted import ScriptedBackend, lists

    copied = EXAMPLES[2].routing_plan.steps[0].subtask
    backend = ScriptedBackend([lists([1], [copied], [[]])], prompt_form=PromptForm.FULL)
    pool = [PoolEntry(name="a", description="any"), PoolEntry(name="b", description="any")]
    request = PlanRequest(question="pens?", pool=pool, max_steps=5, fallback_model_id=0)
    outcome = await ConductorPlanner(backend).plan(request)
    assert not outcome.valid
    assert "copied from the prompt's examples" in outcome.errors[0]
    assert outcome.plan == fallback_plan(0)


# -- transformers: micro-batching ------------------------------------------------------------


async def test_concurrent_requests_run_in_batches_with_the_answers_of_one_at_a_time(
    tiny_backend: TransformersPlannerBackend, generate_calls: GenerateCalls
) -> None:
    # Prompts of different lengths (left padding) and different max_tokens in one batch.
    prompts = [_ask(f"Question {i}: " + "why " * (5 * i)) for i in range(6)]
    budgets = [3, 5, 8, 13, 21, 34]

    alone = [
        await tiny_backend.generate(p, json_schema=None, max_tokens=n, temperature=0.0)
        for p, n in zip(prompts, budgets, strict=True)
    ]
    assert generate_calls.sizes == [1] * 6

    generate_calls.sizes.clear()
    told: list[int] = []
    tiny_backend.on_batch = told.append  # what the planner service's metrics are told
    together = await asyncio.gather(
        *(
            tiny_backend.generate(p, json_schema=None, max_tokens=n, temperature=0.0)
            for p, n in zip(prompts, budgets, strict=True)
        )
    )
    assert generate_calls.sizes == [4, 2]  # max_batch_size 4: six requests, two model calls
    assert told == [4, 2]
    assert generate_calls.most_running == 1
    assert together == alone  # text, usage and finish reason, request by request
    assert len({c.text for c in together}) == len(together)  # each its own answer
    for completion, budget in zip(together, budgets, strict=True):
        # The random model never writes EOS this early: each answer is cut at its own budget.
        assert completion.finish_reason == "length"
        assert completion.usage.completion_tokens == budget
        assert completion.text


async def test_a_batch_holds_one_temperature(
    tiny_backend: TransformersPlannerBackend, generate_calls: GenerateCalls
) -> None:
    temperatures = [0.0, 0.8, 0.0, 0.8, 0.0, 0.8]
    results = await asyncio.gather(
        *(
            tiny_backend.generate(
                _ask(f"Question {i}"), json_schema=None, max_tokens=4, temperature=t
            )
            for i, t in enumerate(temperatures)
        )
    )
    assert generate_calls.sizes == [3, 3]
    assert generate_calls.sampling == [(False, None), (True, 0.8)]
    assert all(r.usage.completion_tokens == 4 for r in results)


async def test_a_caller_that_gives_up_is_left_out_of_the_batch(
    tiny_backend: TransformersPlannerBackend, generate_calls: GenerateCalls
) -> None:
    tasks = [
        asyncio.create_task(
            tiny_backend.generate(
                _ask(f"Question {i}"), json_schema=None, max_tokens=3, temperature=0.0
            )
        )
        for i in range(3)
    ]
    await asyncio.sleep(0)  # all three queued, the batcher not yet run
    tasks[1].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[1], asyncio.CancelledError)
    assert isinstance(done[0], Completion)
    assert isinstance(done[2], Completion)
    assert generate_calls.sizes == [2]


async def test_closing_cuts_the_running_batch_fails_waiting_requests_and_frees_the_model(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = load_transformers_backend(str(tiny_checkpoint), device="cpu")
    calls = _count_generate_calls(backend, monkeypatch)
    long = asyncio.create_task(
        backend.generate(_ask("Go on"), json_schema=None, max_tokens=3000, temperature=0.0)
    )
    await asyncio.to_thread(calls.started.wait, 10)
    waiting = asyncio.create_task(  # another temperature: it waits for the next batch
        backend.generate(_ask("Next"), json_schema=None, max_tokens=3, temperature=0.5)
    )
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    await backend.aclose()
    assert time.perf_counter() - started < 5  # the running generate stopped at its next token
    for task in (long, waiting):
        with pytest.raises(ConductorError, match="closed"):
            await task
    assert calls.sizes == [1]
    with pytest.raises(ConductorError, match="closed"):
        _ = backend.model
    with pytest.raises(ConductorError, match="closed"):
        await backend.generate(_ask("After"), json_schema=None, max_tokens=3, temperature=0.0)
    await backend.aclose()  # twice is fine


# -- transformers: configuration errors ------------------------------------------------------


def test_the_transformers_backend_without_its_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails, as when not installed
    with pytest.raises(ConfigurationError, match=TRANSFORMERS_HINT):
        create_backend(Settings(planner_backend="transformers", planner_model=None))


def test_a_gguf_model_without_accelerate_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _require_extra()
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(ConfigurationError, match="accelerate"):
        load_transformers_backend(None)


def test_model_references_resolve_or_fail_clearly(tmp_path: Path) -> None:
    gguf = smollm2_gguf_path()
    assert resolve_model(None) == resolve_model("builtin:smollm2")
    assert resolve_model(None).path == str(gguf.parent)
    assert resolve_model(None).gguf_file == gguf.name
    assert resolve_model(str(gguf)).gguf_file == gguf.name
    assert resolve_model(str(tmp_path)).path == str(tmp_path)
    assert resolve_model(str(tmp_path)).gguf_file is None
    assert resolve_model("org/conductor-7b").path == "org/conductor-7b"  # a hub id
    with pytest.raises(ModelNotFoundError, match="not found"):
        resolve_model(str(tmp_path / "absent"))
    with pytest.raises(ModelNotFoundError, match="not found"):
        resolve_model("absent.gguf")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="not a GGUF file"):
        resolve_model(str(tmp_path / "weights.bin"))


def test_devices_and_dtypes_are_checked_before_loading(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigurationError, match="no CUDA GPU"):
        load_transformers_backend(str(tiny_checkpoint), device="cuda")
    with pytest.raises(ConfigurationError, match="not a torch device"):
        load_transformers_backend(str(tiny_checkpoint), device="abacus")
    with pytest.raises(ConfigurationError, match="DTYPE"):
        load_transformers_backend(str(tiny_checkpoint), dtype="float8")
    backend = load_transformers_backend(str(tiny_checkpoint), dtype="bfloat16")
    assert str(backend.device) == "cpu"  # no GPU: the CPU, unasked
    assert backend.model.dtype == torch.bfloat16
    asyncio.run(backend.aclose())


# -- vLLM ------------------------------------------------------------------------------------


def test_the_vllm_backend_without_vllm_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigurationError, match=VLLM_HINT):
        create_backend(Settings(planner_backend="vllm", planner_model="org/conductor-7b"))


def test_the_vllm_backend_needs_a_model() -> None:
    for model in (None, "builtin:smollm2"):
        with pytest.raises(ConfigurationError, match="CONDUCTOR_PLANNER_MODEL"):
            create_backend(Settings(planner_backend="vllm", planner_model=model))


@dataclass
class FakeVLLM:
    """Stand-in ``vllm`` and ``vllm.sampling_params`` modules recording what they are given."""

    tokenizer: Any
    output_text: str = ""
    engine_args: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[dict[str, Any], Any, str]] = field(default_factory=list)
    shutdowns: int = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self

        class SamplingParams:
            def __init__(self, **kwargs: Any) -> None:
                self.kwargs = kwargs

        class StructuredOutputsParams:
            def __init__(self, json: Any = None, disable_any_whitespace: bool = False) -> None:
                self.json = json
                self.disable_any_whitespace = disable_any_whitespace

        class RequestOutputKind:
            CUMULATIVE = 0
            DELTA = 1
            FINAL_ONLY = 2

        class Engine:
            async def get_tokenizer(self) -> Any:  # a coroutine, as in older vLLM
                return fake.tokenizer

            async def generate(self, prompt: dict[str, Any], params: Any, request_id: str) -> Any:
                fake.requests.append((prompt, params, request_id))
                text = fake.output_text
                for end in (len(text) // 2, len(text)):  # cumulative outputs; the last one counts
                    choice = types.SimpleNamespace(
                        text=text[:end], token_ids=list(range(end // 4)), finish_reason="stop"
                    )
                    yield types.SimpleNamespace(
                        outputs=[choice], prompt_token_ids=prompt["prompt_token_ids"]
                    )

            def shutdown(self) -> None:
                fake.shutdowns += 1

        class AsyncLLMEngine:
            @staticmethod
            def from_engine_args(args: dict[str, Any]) -> Engine:
                return Engine()

        def engine_args(**kwargs: Any) -> dict[str, Any]:
            fake.engine_args.append(kwargs)
            return kwargs

        vllm = types.ModuleType("vllm")
        sampling = types.ModuleType("vllm.sampling_params")
        vllm.AsyncEngineArgs = engine_args  # type: ignore[attr-defined]
        vllm.AsyncLLMEngine = AsyncLLMEngine  # type: ignore[attr-defined]
        sampling.SamplingParams = SamplingParams  # type: ignore[attr-defined]
        sampling.StructuredOutputsParams = StructuredOutputsParams  # type: ignore[attr-defined]
        sampling.RequestOutputKind = RequestOutputKind  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "vllm", vllm)
        monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)


def test_the_vllm_backend_without_a_gpu_says_so(
    chat_tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fake = FakeVLLM(chat_tokenizer)
    fake.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigurationError, match="needs a GPU"):
        create_backend(Settings(planner_backend="vllm", planner_model="org/conductor-7b"))
    assert fake.engine_args == []  # no engine was started


async def test_the_vllm_backend_maps_a_plan_request_onto_the_engine(
    chat_tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    plan = {
        "reasoning": "Arithmetic.",
        "steps": [{"model_id": 1, "subtask": "17*23", "access_list": []}],
    }
    fake = FakeVLLM(chat_tokenizer, output_text=json.dumps(plan))
    fake.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backend = create_backend(
        Settings(
            planner_backend="vllm",
            planner_model=str(tmp_path),
            planner_dtype="bfloat16",
            planner_gpu_memory_utilization=0.5,
            planner_max_model_len=4096,
            planner_structured=True,  # JSON under the plan's schema (default: the lists form)
        )
    )
    assert isinstance(backend, VLLMPlannerBackend)
    assert backend.plan_format is PlanFormat.JSON
    assert fake.engine_args == [
        {
            "model": str(await asyncio.to_thread(tmp_path.resolve)),
            "dtype": "bfloat16",
            "gpu_memory_utilization": 0.5,
            "max_model_len": 4096,
            "disable_log_stats": True,
        }
    ]

    outcome = await ConductorPlanner(backend).plan(
        PlanRequest(question="What is 17 * 23?", pool=POOL, max_steps=3, temperature=0.2)
    )
    assert outcome.valid, outcome.errors
    assert outcome.backend == "vllm"
    assert [s.model_id for s in outcome.plan.steps] == [1]
    ((prompt, params, request_id),) = fake.requests
    assert request_id.startswith("plan-")
    assert prompt["prompt_token_ids"] == prompt_token_ids(
        chat_tokenizer, render_json_prompt("What is 17 * 23?")
    )
    assert outcome.usage.prompt_tokens == len(prompt["prompt_token_ids"])
    assert outcome.usage.completion_tokens == len(json.dumps(plan)) // 4
    assert params.kwargs["max_tokens"] == 1024
    assert params.kwargs["temperature"] == 0.2
    assert params.kwargs["output_kind"] == 2  # FINAL_ONLY
    constraint = params.kwargs["structured_outputs"]
    assert constraint.json["required"] == ["reasoning", "steps"]
    assert constraint.disable_any_whitespace is True

    await backend.aclose()
    assert fake.shutdowns == 1
    # Unstructured (the default), it serves a trained checkpoint's lists form
    lists_backend = create_backend(Settings(planner_backend="vllm", planner_model=str(tmp_path)))
    assert lists_backend.plan_format is PlanFormat.LISTS
    await lists_backend.aclose()


def render_json_prompt(question: str) -> list[ChatMessage]:
    from conductor.protocol import render_prompt

    return render_prompt(
        PlanRequest(question=question, pool=POOL, max_steps=3, temperature=0.2), PlanFormat.JSON
    )


def test_structured_outputs_are_found_by_feature_detection() -> None:
    schema = {"type": "object"}

    class StructuredOutputsParams:  # vLLM >= 0.11
        def __init__(self, json: Any = None, disable_any_whitespace: bool = False) -> None:
            self.json = json
            self.disable_any_whitespace = disable_any_whitespace

    class GuidedDecodingParams:  # earlier vLLM, without the whitespace option
        def __init__(self, json: Any = None) -> None:
            self.json = json

    new = types.SimpleNamespace(StructuredOutputsParams=StructuredOutputsParams)
    both = types.SimpleNamespace(
        StructuredOutputsParams=StructuredOutputsParams, GuidedDecodingParams=GuidedDecodingParams
    )
    old = types.SimpleNamespace(GuidedDecodingParams=GuidedDecodingParams)

    for module in (new, both):
        kwargs = structured_output_kwargs(module, schema)
        assert list(kwargs) == ["structured_outputs"]
        assert isinstance(kwargs["structured_outputs"], StructuredOutputsParams)
        assert kwargs["structured_outputs"].json == schema
        assert kwargs["structured_outputs"].disable_any_whitespace is True
    kwargs = structured_output_kwargs(old, schema)
    assert list(kwargs) == ["guided_decoding"]
    assert isinstance(kwargs["guided_decoding"], GuidedDecodingParams)
    assert kwargs["guided_decoding"].json == schema
    with pytest.raises(ConfigurationError, match="neither"):
        structured_output_kwargs(types.SimpleNamespace(), schema)


def test_the_lists_format_on_vllm_sends_no_constraint() -> None:
    class SamplingParams:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    module = types.SimpleNamespace(SamplingParams=SamplingParams)  # no RequestOutputKind either
    backend = VLLMPlannerBackend(
        object(), module, model_name="conductor", plan_format=PlanFormat.LISTS
    )
    params = backend.sampling_params(json_schema={"type": "object"}, max_tokens=64, temperature=0)
    assert params.kwargs == {"max_tokens": 64, "temperature": 0}
