"""GRPO training: the method's reward on live rollouts, the data, and the loop end to end."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from conductor.pool import Provider, parse_pool
from conductor.ports import PlanRequest, PromptForm
from conductor.workflow import PlanOutcome, PoolEntry
from conductor_evaluation.datasets import load_suite
from conductor_evaluation.replay import ReplayWorker, replay_pool
from conductor_evaluation.reward import INVALID, RIGHT, WRONG
from conductor_evaluation.sim import SimWorker, builtin_sim_pool
from conductor_evaluation.split import HELD_OUT_SHARE, is_held_out, split_items
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.registry import build_workers
from conductor_planner import ConductorPlanner
from conductor_trainer.metrics import read_metrics
from conductor_trainer.rollout import PlanRewarder, RecursionStage
from conductor_trainer.training_data import pool_for, prompt_rows

from fakes.cli import run_conductor, run_conductor_here
from fakes.scripted import ScriptedBackend

SIM_PROVIDER = {Provider.SIM: SimWorker.from_spec}
REPLAY_PROVIDER = {Provider.REPLAY: ReplayWorker.from_spec}

POOL = parse_pool(
    {
        "workers": {
            "never": {"provider": "sim", "model": "sim/never", "sim": {"default": 0.0}},
            "always": {"provider": "sim", "model": "sim/always", "sim": {"default": 1.0}},
        }
    }
)
ITEMS = {item.key: item for item in load_suite("gsm8k", limit=3, seed=0)}
KEY = next(iter(ITEMS))


def lists(model_ids: list[int], access: str = "[]") -> str:
    subtasks = json.dumps(["Solve it."] * len(model_ids))
    accesses = ", ".join([access] * len(model_ids))
    return (
        f"Reasoning first.\nmodel_id = {model_ids}\nsubtasks = {subtasks}\n"
        f"access_list = [{accesses}]"
    )


@pytest.fixture
def rewarder() -> PlanRewarder:
    return PlanRewarder(
        POOL, WorkerGateway(POOL, build_workers(POOL, providers=SIM_PROVIDER)), ITEMS
    )


@pytest.mark.parametrize(
    ("text", "names", "expected"),
    [
        pytest.param("I would ask model 1.", ["never", "always"], INVALID, id="unparseable"),
        pytest.param(lists([2]), ["never", "always"], INVALID, id="id-outside-the-pool"),
        pytest.param(lists([0, 0, 0, 0, 0, 0]), ["never", "always"], INVALID, id="too-many"),
        pytest.param(lists([0]), ["never", "always"], WRONG, id="well-formed-wrong"),
        pytest.param(lists([1]), ["never", "always"], RIGHT, id="right"),
        # Ids index the pool the prompt showed: with only "always" shown, 0 is "always".
        pytest.param(lists([0]), ["always"], RIGHT, id="randomized-pool"),
        pytest.param(lists([0, 1], '["all"]'), ["never", "always"], RIGHT, id="two-steps"),
    ],
)
async def test_the_reward_is_the_methods(
    rewarder: PlanRewarder, text: str, names: list[str], expected: float
) -> None:
    assert (await rewarder.score(text, KEY, names)).reward == expected


async def test_the_reward_function_scores_a_batch_and_logs_its_metrics(
    rewarder: PlanRewarder,
) -> None:
    logged: dict[str, float] = {}
    rewards = await rewarder.reward_function()(
        prompts=["p"] * 3,
        completions=["nonsense", lists([0]), lists([0, 1], '["all"]')],
        item_key=[KEY] * 3,
        pool_names=[["never", "always"]] * 3,
        log_metric=logged.__setitem__,
    )
    assert rewards == [INVALID, WRONG, RIGHT]
    assert logged == {
        "format_valid": 2 / 3,
        "accuracy": 1 / 3,
        "steps_per_plan": 1.5,
        # How the two valid plans routed: both used "never", one "always", whose step saw the
        # first one's output.
        "worker_share/never": 1.0,
        "worker_share/always": 0.5,
        "sees_earlier": 0.5,
    }


# -- the recursion stage ---------------------------------------------------------------------

CONDUCTOR = 2  # the prompt lists the Conductor after the two workers
STOP = "Nothing to add.\nmodel_id = []\nsubtasks = []\naccess_list = []"


@pytest.mark.parametrize(
    ("first", "second", "expected", "recursed", "handed_back"),
    [
        # Answers reached in the first round earn a quarter of their reward...
        pytest.param(lists([1]), STOP, RIGHT * 0.25, False, False, id="right-in-round-one"),
        pytest.param(lists([0]), STOP, WRONG * 0.25, False, False, id="wrong-in-round-one"),
        # ...recursing earns the final answer's whole reward.
        pytest.param(lists([0, CONDUCTOR]), lists([1]), RIGHT, True, True, id="recursed-and-fixed"),
        pytest.param(
            lists([1, CONDUCTOR]), lists([0]), WRONG, True, True, id="recursed-and-spoiled"
        ),
        # A hand-back whose next round stops (or is invalid, which stops it) keeps the first
        # round's answer: discounted, or ending every plan with the Conductor would pay 4x.
        pytest.param(
            lists([0, CONDUCTOR]), STOP, WRONG * 0.25, False, True, id="handed-back-stopped"
        ),
        pytest.param(
            lists([1, CONDUCTOR]), "gibberish", RIGHT * 0.25, False, True, id="handed-back-invalid"
        ),
        pytest.param(lists([CONDUCTOR]), STOP, INVALID, False, False, id="conductor-first"),
        pytest.param(lists([CONDUCTOR, 1]), STOP, INVALID, False, False, id="conductor-not-last"),
    ],
)
async def test_the_recursion_stage_discounts_answers_of_the_first_round(
    first: str, second: str, expected: float, recursed: bool, handed_back: bool
) -> None:
    later = ScriptedBackend([second])
    rewarder = PlanRewarder(
        POOL,
        WorkerGateway(POOL, build_workers(POOL, providers=SIM_PROVIDER)),
        ITEMS,
        recursion=RecursionStage(ConductorPlanner(later)),
    )
    rollout = await rewarder.score(first, KEY, ["never", "always"])
    assert rollout.reward == expected
    assert rollout.recursed is recursed
    # The later round was asked of the policy only when the plan handed back, and it saw the
    # first round's plan.
    assert len(later.requests) == (1 if handed_back else 0)
    if handed_back:
        prompt = " ".join(m.content for m in later.requests[0]["messages"])
        assert "Solve it." in prompt


async def test_the_recursion_stage_logs_how_often_plans_recurse() -> None:
    rewarder = PlanRewarder(
        POOL,
        WorkerGateway(POOL, build_workers(POOL, providers=SIM_PROVIDER)),
        ITEMS,
        recursion=RecursionStage(ConductorPlanner(ScriptedBackend([lists([1])]))),
    )
    logged: dict[str, float] = {}
    await rewarder.reward_function()(
        prompts=["p"] * 2,
        completions=[lists([1]), lists([0, CONDUCTOR])],
        item_key=[KEY] * 2,
        pool_names=[["never", "always"]] * 2,
        log_metric=logged.__setitem__,
    )
    assert logged["recursion_rate"] == 0.5


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model of the Conductor's architecture, as a checkpoint directory."""
    from fakes.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.mark.training
async def test_the_policy_plans_the_recursion_round_with_the_model_being_trained(
    tiny_model: Path,
) -> None:
    """PolicyPlanner wraps the in-memory model (no reload) and answers a second-round request
    the way the served planner would: a valid plan, or a stop when its output is invalid."""
    import torch
    import transformers

    from conductor.machine import CONDUCTOR_ENTRY
    from conductor.ports import PlanRequest, PriorRound
    from conductor.workflow import Plan, PlanStep, PoolEntry
    from conductor_trainer.rollout import PolicyPlanner

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    base_generation = model.generation_config.to_dict()
    policy = PolicyPlanner(model, tokenizer)
    first = Plan(steps=(PlanStep(model_id=0, subtask="Solve it."),))
    request = PlanRequest(
        question="What is 2 + 2?",
        pool=[PoolEntry(name="a", description="any"), CONDUCTOR_ENTRY],
        max_steps=2,
        round=1,
        prior=PriorRound(plan=first, answers=["5"], last_answer="5"),
        max_tokens=24,
        temperature=0,  # greedy: the same text whatever the mode, if the mode is right
    )
    model.eval()
    outcome = await policy.plan(request)
    assert outcome.round == 1
    assert outcome.backend == "transformers"
    assert outcome.raw_output
    assert outcome.valid or outcome.stop  # an invalid later round stops, keeping the answer
    # The checkpoint keeps the base model's generation settings.
    assert model.generation_config.to_dict() == base_generation
    # As during a GRPO step: train mode with gradient checkpointing (TRL's default), where
    # generate would lose its cache. The generation mode plans exactly as in eval mode...
    model.train()
    model.activation_checkpointing_enable({"use_reentrant": False})
    with policy.generation_mode():
        assert not model.training
        during_training = await policy.plan(request)
    assert during_training.raw_output == outcome.raw_output
    # ...and gives the model back to training as it was.
    assert model.training
    assert model.is_activation_checkpointing
    await policy.aclose()


class TemplateTokenizer:
    """The one tokenizer method prompt_rows uses; the chat template is the model's concern."""

    def apply_chat_template(self, messages: list[dict[str, str]], **_: object) -> str:
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def test_recursion_stage_prompts_list_the_conductor_after_the_workers() -> None:
    items = list(ITEMS.values())[:1]
    plain = prompt_rows(
        items, POOL, TemplateTokenizer(), max_steps=5, randomized_pools=False, seed=0
    )
    offered = prompt_rows(
        items,
        POOL,
        TemplateTokenizer(),
        max_steps=5,
        randomized_pools=False,
        seed=0,
        offer_conductor=True,
    )
    assert plain[0]["pool_names"] == offered[0]["pool_names"] == ["never", "always"]
    assert "Model 2: the Conductor" not in plain[0]["prompt"]
    assert "Model 2: the Conductor" in offered[0]["prompt"]


def test_held_out_items_are_a_stable_fifth_never_trained_on() -> None:
    train, held = split_items(["gsm8k"], limit=None, seed=0)
    assert len(held) / (len(train) + len(held)) == pytest.approx(HELD_OUT_SHARE, abs=0.03)
    assert not {i.key for i in train} & {i.key for i in held}
    assert all(is_held_out(i) for i in held)
    limited, _ = split_items(["gsm8k"], limit=10, seed=0)
    assert len(limited) == 10
    # A seeded sample of the training items, not the first ten: a file listed domain by
    # domain (an outcome table) would otherwise give one domain only.
    assert {i.key for i in limited} <= {i.key for i in train}
    assert [i.key for i in limited] != [i.key for i in train[:10]]
    assert [i.key for i in split_items(["gsm8k"], limit=10, seed=0)[0]] == [i.key for i in limited]
    assert [i.key for i in split_items(["gsm8k"], limit=10, seed=1)[0]] != [i.key for i in limited]


def test_randomized_pools_are_non_empty_subsets_in_pool_order() -> None:
    pool = builtin_sim_pool()
    names = [w.name for w in pool.workers]
    shown = [pool_for(item, pool, randomized=True, seed=1) for item in load_suite("gsm8k")[:200]]
    assert all(s and s == [n for n in names if n in s] for s in shown)
    assert len({tuple(s) for s in shown}) > 5
    assert pool_for(load_suite("gsm8k")[0], pool, randomized=False, seed=1) == names


def tiny_training_run(
    out: Path,
    *extra: str,
    steps: int,
    resume: bool = False,
    base_model: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`conductor train` with tiny limits on the sim pool, a checkpoint every step; the real
    SmolLM2 unless ``base_model`` names another; ``extra`` options added. The real model runs
    as a user runs it, in a process of its own; another model runs the same command line in
    this process (importing TRL takes 6 of a tiny run's 8 s)."""
    args = [
        "train",
        *extra,
        *(["--base-model", str(base_model)] if base_model else []),
        *("--pool", "sim", "--suite", "gsm8k", "--steps", str(steps)),
        *("--questions-per-step", "1", "--group-size", "2", "--max-tokens", "24"),
        *("--items", "4", "--out", str(out), "--save-every", "1"),
        *(["--resume"] if resume else []),
    ]
    if base_model is None:
        return run_conductor(*args, timeout=600)
    return run_conductor_here(*args)


def assert_served(checkpoint: Path, *, form: PromptForm | None = None) -> None:
    """The planner's transformers backend loads the checkpoint and plans with it (with the
    prompt form it was trained on, when ``form`` says which)."""
    from conductor_planner.backends.transformers import load_transformers_backend

    assert (checkpoint / "config.json").exists()
    assert "quantization_config" not in json.loads((checkpoint / "config.json").read_text())

    async def plan() -> PlanOutcome:
        backend = load_transformers_backend(str(checkpoint), device="cpu")
        if form is not None:
            assert backend.prompt_form is form
        try:
            return await ConductorPlanner(backend).plan(
                PlanRequest(
                    question="What is 2 + 2?",
                    pool=[PoolEntry(name="a", description="any")],
                    max_steps=2,
                    max_tokens=32,
                )
            )
        finally:
            await backend.aclose()

    outcome = asyncio.run(plan())
    assert outcome.plan.steps  # the model's plan, or the fallback when it was invalid
    assert outcome.usage.completion_tokens > 0  # the checkpoint generated


@pytest.mark.training
@pytest.mark.processes
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' renames, inside TRL
def test_a_short_training_run_writes_a_checkpoint_the_planner_serves(
    tmp_path: Path, tiny_model: Path
) -> None:
    """One GRPO step with tiny limits on a tiny random model: the loop end to end, then the
    planner's transformers backend loads the checkpoint and plans with it, then a resumed run
    adds a step."""
    out = tmp_path / "train"
    done = tiny_training_run(out, steps=1, base_model=tiny_model)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert all({"reward", "format_valid", "steps_per_plan"} <= set(r) for r in rows)
    assert (out / "training_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert_served(out / "checkpoint", form=PromptForm.FULL)
    # Interrupted runs carry on from their last checkpoint: one more step, not three.
    assert [p.name for p in (out / "trainer").glob("checkpoint-*")] == ["checkpoint-1"]
    resumed = tiny_training_run(out, steps=2, resume=True, base_model=tiny_model)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]


@pytest.mark.training
@pytest.mark.processes
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' renames, inside TRL
def test_lora_training_saves_the_adapters_merged_into_one_model_the_planner_serves(
    tmp_path: Path, tiny_model: Path
) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "train"
    done = tiny_training_run(
        out,
        "--lora-rank",
        "4",
        "--prompt-form",
        "compact",
        "--cost-weight",
        "0.05",
        steps=1,
        base_model=tiny_model,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = out / "checkpoint"
    assert not (checkpoint / "adapter_config.json").exists()  # one model, not base + adapter
    trained = load_file(str(checkpoint / "model.safetensors"))
    base = load_file(str(tiny_model / "model.safetensors"))
    # The base's own weight names and shapes: no LoRA matrix left over. (Whether it learnt
    # cannot show here: a random tiny model's samples are all invalid, every advantage 0.)
    assert {n: t.shape for n, t in trained.items()} == {n: t.shape for n, t in base.items()}
    recorded = json.loads((out / "train_options.json").read_text())
    assert (recorded["lora_rank"], recorded["prompt_form"]) == (4, "compact")
    # The checkpoint itself records the reward's cost weight it was trained with.
    form = json.loads((checkpoint / "conductor_prompt.json").read_text())
    assert form == {"form": "compact", "few_shot_examples": False, "reward_cost_weight": 0.05}
    assert_served(checkpoint, form=PromptForm.COMPACT)  # served as trained: in brief


@pytest.mark.model
@pytest.mark.training
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_the_real_model_trains_a_step_into_a_checkpoint_the_planner_serves(tmp_path: Path) -> None:
    """One GRPO step on SmolLM2 itself: its GGUF weights are dequantized (and cached) to train,
    and the checkpoint must no longer be marked quantized, or the planner could not serve it."""
    out = tmp_path / "train"
    done = tiny_training_run(out, steps=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]
    assert_served(out / "checkpoint")


@pytest.mark.processes
def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    done = run_conductor("train", "--pool", "sim", "--out", str(tmp_path / "none"), "--resume")
    assert done.returncode == 2
    assert "--resume: no checkpoint under" in done.stderr


def test_grpo_fields_pass_through_and_unknown_ones_are_refused() -> None:
    from conductor.errors import ConfigurationError
    from conductor_cli.train import grpo_fields

    fields = grpo_fields(["use_vllm=true", "vllm_mode=colocate", "gradient_accumulation_steps=4"])
    assert fields == {"use_vllm": True, "vllm_mode": "colocate", "gradient_accumulation_steps": 4}
    with pytest.raises(ConfigurationError, match="KEY=VALUE"):
        grpo_fields(["use_vllm"])


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    ("choice", "speedup", "bf16"),
    [("auto", 4.4, True), ("auto", 0.02, False), ("fp32", 4.4, False), ("bf16", 0.02, True)],
)
def test_cpu_training_takes_bf16_only_where_it_is_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, choice: str, speedup: float, bf16: bool
) -> None:
    # TRL defaults to bf16, which on a CPU without bf16 units runs matmuls ~50x slower, and
    # with them (AMX) ~4x faster than float32: "auto" follows the CPU's measured speed.
    import trl

    from conductor_trainer import precision
    from conductor_trainer.train import TrainOptions, grpo_config

    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: speedup)
    options = TrainOptions(suites=["gsm8k"], out=tmp_path, precision=choice)  # type: ignore[arg-type]
    config = grpo_config(options, trl, use_cpu=True)
    assert config.bf16 is bf16
    assert config.fp16 is False


def test_an_unknown_precision_is_refused() -> None:
    from conductor.errors import ConfigurationError
    from conductor_trainer.precision import uses_bf16

    with pytest.raises(ConfigurationError, match="auto, bf16, fp32"):
        uses_bf16("fp8", use_cpu=True)  # type: ignore[arg-type]


def test_the_cpu_bf16_speed_is_measured_as_a_ratio_to_float32() -> None:
    from conductor_trainer.precision import cpu_bf16_speedup

    assert cpu_bf16_speedup(size=64, repeats=1) > 0


def test_format_warmup_targets_are_valid_plans_for_the_pool_shown() -> None:
    from conductor.protocol import ParseFailure, parse_plan, validate_plan
    from conductor_trainer.warmup import format_examples

    rows = [{"prompt": "p", "pool_names": ["a", "b", "c"][: 1 + i % 3]} for i in range(60)]
    examples = format_examples(rows, max_steps=5, seed=0, form=PromptForm.FULL)
    minimal = format_examples(rows, max_steps=5, seed=0, form=PromptForm.MINIMAL)
    shapes = set()
    for row, example, bare in zip(rows, examples, minimal, strict=True):
        # The minimal form's targets are the same plans without their line of reasoning.
        assert bare["completion"].startswith("model_id = [")
        assert example["completion"].endswith("\n" + bare["completion"])
        parsed = parse_plan(example["completion"])
        assert not isinstance(parsed, ParseFailure)
        checked = validate_plan(
            parsed,
            pool_size=len(row["pool_names"]),
            max_steps=5,
            conductor_id=None,
            allow_stop=False,
        )
        assert not checked.errors
        assert checked.plan is not None
        shapes.add(len(checked.plan.steps))
    assert shapes == {1, 2, 3}


def test_the_curve_is_redrawn_at_each_checkpoint(tmp_path: Path) -> None:
    """A run stopped between checkpoints still has its curve up to the last one."""
    from types import SimpleNamespace

    import transformers

    from conductor_trainer.metrics import MetricsFile

    curve = tmp_path / "curve.png"
    callback = MetricsFile(tmp_path / "metrics.jsonl", curve=curve).callback(transformers)
    state = SimpleNamespace(global_step=1)
    callback.on_save(None, state, None)
    assert not curve.exists()  # nothing logged yet: nothing to draw
    logs = {
        "reward": 0.5,
        "format_valid": 1.0,
        "steps_per_plan": 1.0,
        "recursion_rate": 0.25,
        "worker_share/never": 0.5,
        "sees_earlier": 0.25,
    }
    callback.on_log(None, state, None, logs=logs)
    callback.on_save(None, state, None)
    assert curve.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.training
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' renames, inside TRL
def test_training_reports_what_it_is_doing_at_each_step(tmp_path: Path, tiny_model: Path) -> None:
    from conductor_adapters.settings import Settings
    from conductor_cli.wiring import in_process_gateway
    from conductor_trainer.train import TrainOptions, train

    heard: list[tuple[str, int, int]] = []
    options = TrainOptions(
        suites=["gsm8k"],
        out=tmp_path / "train",
        steps=2,
        questions_per_step=1,
        group_size=2,
        max_completion_tokens=16,
        items_per_suite=4,
        base_model=str(tiny_model),
        save_every=1,
    )
    settings = Settings()
    train(
        options,
        settings,
        lambda pool: in_process_gateway(pool, settings),
        lambda phase, done, total: heard.append((phase, done, total)),
    )

    grpo = [(phase, done) for phase, done, total in heard if total == 2]
    # Each step: sampling, then scoring the samples, then the update, then its checkpoint.
    assert grpo[:6] == [
        ("generating", 0),
        ("scoring", 0),
        ("updating", 0),
        ("step done", 1),
        ("saving", 1),
        ("generating", 1),
    ]
    assert grpo[-2:] == [("step done", 2), ("saving", 2)]


@pytest.mark.training
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_the_format_warmup_leaves_activation_checkpointing_as_it_found_it(
    tmp_path: Path, tiny_model: Path
) -> None:
    """SFT turns checkpointing on; left on, GRPO would run with it whatever its settings say."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_trainer.checkpointing import checkpointing_is_on
    from conductor_trainer.warmup import warm_up

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    examples = [{"prompt": "Question: 2 + 2?\n", "completion": "model_id = [0]"}] * 4
    assert not checkpointing_is_on(model)
    warm_up(
        model, tokenizer, examples, steps=1, learning_rate=1e-4, out=tmp_path, use_cpu=True, seed=0
    )
    assert not checkpointing_is_on(model)


async def test_a_sampled_plan_on_a_replay_pool_is_rewarded_by_the_final_workers_recorded_score(
    tmp_path: Path,
) -> None:
    # Given an outcome table on which one recorded worker was right and the other wrong, and
    # its replay pool
    table = tmp_path / "table.jsonl"
    outcomes = {"acme/Right": {"score": 1.0, "cost_usd": 0.01}, "acme/Wrong": {"score": 0.0}}
    row = {"id": "q1", "question": "What is 6 * 7?", "domain": "math", "split": "train"}
    table.write_text(json.dumps({**row, "outcomes": outcomes}) + "\n", encoding="utf-8")
    pool = replay_pool(table)
    items = {item.key: item for item in load_suite(f"table:{table}")}
    key = next(iter(items))
    gateway = WorkerGateway(pool, build_workers(pool, providers=REPLAY_PROVIDER))
    rewarder = PlanRewarder(pool, gateway, items)
    names = [w.name for w in pool.workers]  # "right", "wrong"
    # When plans answer through each, and through the wrong one checking the right one
    # Then each is rewarded as its final worker's recorded score says (no verifier can read a
    # replayed answer)
    assert (await rewarder.score(lists([names.index("right")]), key, names)).reward == RIGHT
    assert (await rewarder.score(lists([names.index("wrong")]), key, names)).reward == WRONG
    two_steps = lists([names.index("right"), names.index("wrong")], '["all"]')
    assert (await rewarder.score(two_steps, key, names)).reward == WRONG


def _priced_replay(tmp_path: Path) -> tuple[PlanRewarder, str, list[str]]:
    """A rewarder on a replay pool where both workers are right: "dear" costs 4 cents and
    "cheap" 1 cent on the question, with a cost weight of 0.2."""
    table = tmp_path / "table.jsonl"
    outcomes = {
        "acme/Dear": {"score": 1.0, "cost_usd": 0.04},
        "acme/Cheap": {"score": 1.0, "cost_usd": 0.01},
    }
    row = {"id": "q1", "question": "What is 6 * 7?", "domain": "math", "split": "train"}
    table.write_text(json.dumps({**row, "outcomes": outcomes}) + "\n", encoding="utf-8")
    pool = replay_pool(table)
    items = {item.key: item for item in load_suite(f"table:{table}")}
    gateway = WorkerGateway(pool, build_workers(pool, providers=REPLAY_PROVIDER))
    rewarder = PlanRewarder(pool, gateway, items, cost_weight=0.2)
    return rewarder, next(iter(items)), [w.name for w in pool.workers]


async def test_a_cost_aware_reward_charges_a_plan_its_cost_over_the_dearest_single_call(
    tmp_path: Path,
) -> None:
    # Given two workers right on the question, one four times the other's price
    rewarder, key, names = _priced_replay(tmp_path)
    dear, cheap = names.index("dear"), names.index("cheap")
    # Then the dearest single call is the dear worker's recorded cost
    assert await rewarder.dearest_call(rewarder.items[key]) == pytest.approx(0.04)
    # And a right plan loses weight x its cost over that call: the cheap one a quarter of it
    by_dear = await rewarder.score(lists([dear]), key, names)
    by_cheap = await rewarder.score(lists([cheap]), key, names)
    assert by_dear.reward == pytest.approx(RIGHT - 0.2)
    assert by_cheap.reward == pytest.approx(RIGHT - 0.2 * 0.25)
    assert by_cheap.relative_cost == pytest.approx(0.25)
    # Two calls cost the sum of both; an invalid plan still earns 0, never less
    both = await rewarder.score(lists([cheap, dear], '["all"]'), key, names)
    assert both.reward == pytest.approx(RIGHT - 0.2 * 1.25)
    assert (await rewarder.score("no plan", key, names)).reward == INVALID
    # And the metric the training curve shows is the valid plans' mean relative cost
    logged: dict[str, float] = {}
    await rewarder.reward_function()(
        prompts=["p"] * 2,
        completions=[lists([dear]), lists([cheap])],
        item_key=[key] * 2,
        pool_names=[names] * 2,
        log_metric=logged.__setitem__,
    )
    assert logged["relative_cost"] == pytest.approx((1 + 0.25) / 2)


def test_a_cost_weight_outside_zero_to_one_is_refused(tmp_path: Path) -> None:
    from conductor.errors import ConfigurationError

    rewarder, _, _ = _priced_replay(tmp_path)
    with pytest.raises(ConfigurationError, match="--cost-weight must be between 0 and 1"):
        PlanRewarder(rewarder.pool, rewarder.gateway, rewarder.items, cost_weight=1.5)


async def test_a_plan_copying_an_example_subtask_is_invalid_where_the_prompt_showed_them(
    rewarder: PlanRewarder,
) -> None:
    from conductor.protocol.examples import EXAMPLES

    copied = EXAMPLES[0].routing_plan.steps[0].subtask
    text = f"model_id = [1]\nsubtasks = {json.dumps([copied])}\naccess_list = [[]]"
    assert rewarder.prompt_form is PromptForm.FULL  # train's default prompt carries them
    assert (await rewarder.score(text, KEY, ["never", "always"])).reward == INVALID
    rewarder.prompt_form = PromptForm.COMPACT
    assert (await rewarder.score(text, KEY, ["never", "always"])).reward == RIGHT


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(("cost_weight", "scaling"), [(0.0, "group"), (0.1, "batch")])
def test_with_a_cost_weight_rewards_are_scaled_by_the_batch_s_spread(
    tmp_path: Path, cost_weight: float, scaling: str
) -> None:
    # A group whose plans are all right differs by cost alone; scaled by its own spread, that
    # would weigh as much as right against wrong.
    import trl

    from conductor_trainer.train import TrainOptions, grpo_config

    options = TrainOptions(suites=["gsm8k"], out=tmp_path, cost_weight=cost_weight)
    assert grpo_config(options, trl, use_cpu=True).scale_rewards == scaling
