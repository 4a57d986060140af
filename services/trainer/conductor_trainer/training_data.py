"""Training prompts: each question rendered as the Conductor sees it in serving, for a pool.

The prompt text is the planner's own (``render_prompt`` in the paper's three-lists form, then
the tokenizer's chat template, as the transformers backend renders it), so the trained model
is served exactly as it was trained. With randomized pools each question shows a random subset
of the workers, so the Conductor learns to plan for whatever pool a key allows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from conductor.machine import CONDUCTOR_ENTRY
from conductor.pool import Pool
from conductor.ports import PlanFormat, PlanRequest, PromptForm
from conductor.protocol import render_prompt
from conductor.workflow import PoolEntry
from conductor_evaluation import EvalItem


def pool_for(
    item: EvalItem, pool: Pool, *, randomized: bool, seed: int, epoch: int = 0
) -> list[str]:
    """The workers a training question shows, in pool order: all, or a random non-empty subset."""
    names = [w.name for w in pool.workers]
    if not randomized or len(names) == 1:
        return names
    rng = random.Random(f"{seed}\0{epoch}\0{item.key}")
    size = rng.randint(1, len(names))
    chosen = set(rng.sample(names, size))
    return [n for n in names if n in chosen]


def prompt_rows(
    items: Sequence[EvalItem],
    pool: Pool,
    tokenizer: Any,
    *,
    max_steps: int,
    randomized_pools: bool,
    seed: int,
    offer_conductor: bool = False,
    form: PromptForm = PromptForm.FULL,
) -> list[dict[str, Any]]:
    """Dataset rows for GRPOTrainer: the prompt text and what the reward needs to score it.
    ``offer_conductor`` lists the Conductor after the workers, as a variant with recursion
    rounds does (the recursion stage); ``form``: the prompt form trained on."""
    described = {w.name: w.description for w in pool.workers}
    rows = []
    for item in items:
        names = pool_for(item, pool, randomized=randomized_pools, seed=seed)
        entries = [PoolEntry(name=n, description=described[n]) for n in names]
        request = PlanRequest(
            question=item.question,
            pool=[*entries, CONDUCTOR_ENTRY] if offer_conductor else entries,
            max_steps=max_steps,
        )
        messages = [m.as_text_turn() for m in render_prompt(request, PlanFormat.LISTS, form=form)]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        rows.append({"prompt": text, "item_key": item.key, "pool_names": names})
    return rows
