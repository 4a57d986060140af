"""An optional format warm-up before GRPO: supervised steps on random *valid* plans.

GRPO learns only from differences in reward within a group. A small base model that never
writes the three lists (SmolLM2-135M sampled 0 valid plans in 36 tries on our prompt) gets
reward 0 on every sample, so every advantage is 0 and nothing is learned. A few supervised
steps on plans drawn uniformly at random (random workers, step counts and access lists, the
baselines' subtasks) teach the output format and nothing about which worker to pick: routing
is still left to the reward. The paper's 7B base needs no such step; skip it for models that
already write valid plans.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conductor.ports import PromptForm
from conductor.workflow import ALL, AccessEntry, Plan, PlanStep
from conductor_trainer.checkpointing import checkpointing_is_on, set_checkpointing
from conductor_trainer.precision import PrecisionChoice, precision_fields

# Short subtasks: the targets must fit well inside the completion budget, or the model learns
# to start plans it cannot finish within max tokens (a cut plan does not parse).
SOLVE = "Solve the question."
REVIEW = "Check the answer above and fix any mistake."
AGGREGATE = "Compare the answers above and give the best one."

REASONS = (
    "I will hand this to the model best suited to it.",
    "One model solves it, another checks the answer.",
    "Two models answer independently and a third compares them.",
)


def random_plan(pool_size: int, max_steps: int, rng: random.Random) -> tuple[str, Plan]:
    """A valid plan of 1-3 steps over ``pool_size`` workers, with a line of reasoning."""
    shape = rng.randrange(min(3, max_steps))
    ids = [rng.randrange(pool_size) for _ in range(shape + 1)]
    if shape == 0:
        steps = [PlanStep(model_id=ids[0], subtask=SOLVE)]
    elif shape == 1:
        steps = [
            PlanStep(model_id=ids[0], subtask=SOLVE),
            PlanStep(model_id=ids[1], subtask=REVIEW, access_list=(0,)),
        ]
    else:
        access: tuple[AccessEntry, ...] = (ALL,)
        steps = [
            PlanStep(model_id=ids[0], subtask=SOLVE),
            PlanStep(model_id=ids[1], subtask=SOLVE),
            PlanStep(model_id=ids[2], subtask=AGGREGATE, access_list=access),
        ]
    return REASONS[shape], Plan(steps=tuple(steps))


def target_completion(reason: str, plan: Plan, form: PromptForm) -> str:
    """A warm-up's target output: the reasoning line (not in the minimal form), then the lists."""
    return f"{reason}\n{plan.as_lists_text()}" if form.reasoning else plan.as_lists_text()


def format_examples(
    rows: Sequence[dict[str, Any]], *, max_steps: int, seed: int, form: PromptForm
) -> list[dict[str, str]]:
    """Prompt-completion pairs: each training prompt (rendered in ``form``) with a random valid
    plan as the answer."""
    rng = random.Random(seed)
    examples = []
    for row in rows:
        reason, plan = random_plan(len(row["pool_names"]), max_steps, rng)
        examples.append(
            {"prompt": row["prompt"], "completion": target_completion(reason, plan, form)}
        )
    return examples


def warm_up(
    model: Any,
    tokenizer: Any,
    examples: list[dict[str, str]],
    *,
    steps: int,
    learning_rate: float,
    out: Path,
    use_cpu: bool,
    seed: int,
    precision: PrecisionChoice = "auto",
    callbacks: list[Any] | None = None,
) -> None:
    """Supervised steps on the completions only (TRL's SFTTrainer); trains ``model`` in place.
    ``callbacks``: TrainerCallbacks (progress); with them, TRL's own progress bar is off."""
    import datasets  # type: ignore[import-untyped]
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    config = SFTConfig(
        output_dir=str(out / "warmup"),
        max_steps=steps,
        per_device_train_batch_size=2,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        completion_only_loss=True,
        # No truncation: SFT's default (1,024 tokens, keeping the start) would cut the plan,
        # the only part learnt from, off prompts that carry the few-shot examples.
        max_length=None,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=use_cpu,
        **precision_fields(use_cpu=use_cpu, choice=precision),
        seed=seed,
        disable_tqdm=bool(callbacks),
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=datasets.Dataset.from_list(examples),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    if callbacks:  # they report progress instead of a log line printed per step
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    checkpointing = checkpointing_is_on(model)
    trainer.train()
    # SFT turns activation checkpointing on and leaves it on: GRPO would then run with it
    # whatever its own settings say (and lose the shared prefix in its loss).
    if checkpointing_is_on(model) != checkpointing:
        set_checkpointing(model, checkpointing)
