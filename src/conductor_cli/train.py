"""``conductor train``: teach the Conductor to orchestrate with GRPO on live rollouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from conductor.errors import ConfigurationError
from conductor.ports import PromptForm
from conductor_adapters.settings import get_settings
from conductor_cli.progress import progress_bar, stderr_console
from conductor_trainer.precision import PRECISION_CHOICES, PrecisionChoice


def train_command(
    suite: str = typer.Option(
        "gsm8k", "--suite", "-s", help="Comma-separated suites to train on (as conductor eval)."
    ),
    pool: str = typer.Option(
        "sim", "--pool", help="'sim' (the built-in simulated pool) or a pool YAML file."
    ),
    out: str = typer.Option("train-out", "--out", "-o", help="Output directory."),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps (the paper: 200)."),
    questions: int = typer.Option(
        2, "--questions-per-step", min=1, help="Questions per step (the paper: 4)."
    ),
    group: int = typer.Option(
        4, "--group-size", min=2, help="Samples per question (the paper: 64)."
    ),
    loss_micro_batch: int | None = typer.Option(
        None,
        "--loss-micro-batch",
        min=1,
        help="Rows per forward and backward pass of the loss (the batch is sampled and rewarded "
        "whole, then accumulated): memory scales with it. Default: the group size.",
    ),
    learning_rate: float = typer.Option(1e-6, "--lr", help="AdamW learning rate (cosine)."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature."),
    max_tokens: int = typer.Option(
        384, "--max-tokens", min=16, help="Longest Conductor output (the paper: 1024)."
    ),
    items: int = typer.Option(200, "--items", min=1, help="Training items per suite."),
    randomized_pools: bool = typer.Option(
        False, "--randomized-pools", help="Show each question a random subset of the workers."
    ),
    base_model: str | None = typer.Option(
        None, "--base-model", help="A checkpoint dir, GGUF file or hub id (default: SmolLM2)."
    ),
    format_warmup: int = typer.Option(
        0,
        "--format-warmup",
        min=0,
        help="Supervised steps on random valid plans before GRPO, for base models that never "
        "write the three lists (SmolLM2-135M: try 40).",
    ),
    warmup_labels: str | None = typer.Option(
        None,
        "--warmup-labels",
        help="Route in the warm-up: its target plans send each training question to a "
        "labelled worker. outcomes:PATH[:WEIGHT] (an outcome table or a conductor eval "
        "directory: the best single call under the cost-aware reward at WEIGHT) or "
        "router:FILE[:WEIGHT] (a trained router's choice). Needs --format-warmup.",
    ),
    recursion_stage: bool = typer.Option(
        False,
        "--recursion-stage",
        help="The method's recursion stage (start it from a trained checkpoint with "
        "--base-model): plans may hand back to the Conductor once, the policy plans that round.",
    ),
    first_round_discount: float = typer.Option(
        0.25,
        "--first-round-discount",
        min=0.0,
        max=1.0,
        help="Recursion stage: reward factor for answers reached without recursing.",
    ),
    save_every: int = typer.Option(
        10, "--save-every", min=0, help="Steps between resumable checkpoints (0: none)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Carry on from the last checkpoint in OUT/trainer."
    ),
    seed: int = typer.Option(0, "--seed"),
    cost_weight: float = typer.Option(
        0.0,
        "--cost-weight",
        min=0.0,
        max=1.0,
        help="Cost-aware reward: a valid plan loses this times its workers' cost over the most "
        "expensive single call on its question (0: the method's reward). The checkpoint "
        "records it.",
    ),
    lora_rank: int = typer.Option(
        0,
        "--lora-rank",
        min=0,
        help="Train LoRA adapters of this rank on every linear layer instead of all weights "
        "(0: off); the checkpoint has them merged in and serves as one model.",
    ),
    prompt_form: str | None = typer.Option(
        None,
        "--prompt-form",
        help="The prompts trained on: full (the rules and the few-shot examples), compact (the "
        "rules in brief, a long question's head and tail: 29% of full's tokens on the simulated "
        "pool, 45% on RouterBench's replay pool), minimal (the output format alone, workers by "
        "name, less of a long question, plans without reasoning: 17% and 23%) or short (the "
        "rules, no examples). The "
        "checkpoint records it and is served the same way. Default: as the base model was "
        "trained, and full for a model Conductor training never saw.",
    ),
    precision: str = typer.Option(
        "auto",
        "--precision",
        help="auto, bf16 or fp32. auto: bf16 autocast on a GPU, and on a CPU where bf16 "
        "matmuls measure faster (bf16 matrix units); float32 elsewhere.",
    ),
    grpo: list[str] = typer.Option(  # noqa: B008 (typer's way to declare a repeated option)
        [],
        "--grpo",
        help="More GRPOConfig fields as KEY=VALUE (repeatable), e.g. use_vllm=true, "
        "vllm_mode=colocate, bf16=true, gradient_accumulation_steps=4, deepspeed=ds.json.",
    ),
) -> None:
    """Train the Conductor with GRPO: each sampled plan runs on the pool and is verified
    (reward 0 unparseable, 0.5 wrong, 1 right; less a cost term with --cost-weight). Writes
    OUT/checkpoint (served by the planner's transformers backend), OUT/metrics.jsonl and
    OUT/training_curve.png."""
    from conductor_cli.wiring import in_process_gateway
    from conductor_trainer.train import STEP_DONE, TrainOptions, train

    options = TrainOptions(
        suites=[s.strip() for s in suite.split(",") if s.strip()],
        pool=pool,
        out=Path(out),
        steps=steps,
        questions_per_step=questions,
        group_size=group,
        loss_micro_batch=loss_micro_batch,
        learning_rate=learning_rate,
        temperature=temperature,
        max_completion_tokens=max_tokens,
        items_per_suite=items,
        randomized_pools=randomized_pools,
        base_model=base_model,
        seed=seed,
        lora_rank=lora_rank,
        precision=precision_choice(precision),
        prompt_form=None if prompt_form is None else prompt_form_choice(prompt_form),
        format_warmup_steps=format_warmup,
        warmup_labels=warmup_labels,
        save_every=save_every,
        resume=resume,
        recursion_stage=recursion_stage,
        first_round_discount=first_round_discount,
        cost_weight=cost_weight,
        extra=grpo_fields(grpo),
    )
    settings = get_settings()
    console = stderr_console()
    progress = progress_bar("train", console)
    task = progress.add_task("loading the model and the items", total=None)
    said = ""

    def report(phase: str, done: int, total: int) -> None:
        nonlocal said
        if phase == "saving":
            what = f"saving step {done}"
        elif phase == STEP_DONE:
            what = f"step {done} done"
        else:
            what = f"step {min(done + 1, total)}: {phase}"
        progress.update(task, description=what, completed=done, total=total)
        # Without a terminal the bar is not drawn: a line per change of what it is doing.
        if not console.is_terminal and what != said:
            console.print(f"train: {what} ({done}/{total} steps done)")
        said = what

    with progress:
        outcome = train(
            options, settings, lambda pool: in_process_gateway(pool, settings), progress=report
        )
    typer.echo(f"trained on {outcome.train_items} items; checkpoint: {outcome.checkpoint}")
    typer.echo(f"metrics: {outcome.metrics}")
    typer.echo(f"curve: {outcome.curve}")
    typer.echo(
        "serve it: CONDUCTOR_PLANNER_BACKEND=transformers "
        f"CONDUCTOR_PLANNER_MODEL={outcome.checkpoint} conductor serve"
    )


def precision_choice(value: str) -> PrecisionChoice:
    if value not in PRECISION_CHOICES:
        raise ConfigurationError(
            f"--precision {value!r}: choose one of {', '.join(PRECISION_CHOICES)}"
        )
    return value


def prompt_form_choice(value: str) -> PromptForm:
    try:
        return PromptForm(value)
    except ValueError:
        choices = ", ".join(form.value for form in PromptForm)
        raise ConfigurationError(f"--prompt-form {value!r}: choose one of {choices}") from None


def grpo_fields(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; values read as JSON where they parse (true, 4, 0.5), else text."""
    fields: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--grpo {pair!r}: write KEY=VALUE")
        try:
            fields[key.strip()] = json.loads(value)
        except ValueError:
            fields[key.strip()] = value
    return fields
