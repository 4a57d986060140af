"""The held-out split: the share of each suite that training never uses and evaluation scores.

The split is by item key alone, so the same items are held out in every run whatever its seed,
and ``conductor eval --held-out`` never scores an item a Conductor was trained on. An outcome
table's question keeps its table's own split where it has one (its source's test set).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from conductor_evaluation.datasets import load_suite
from conductor_evaluation.items import AnswerKind, EvalItem

HELD_OUT_SHARE = 0.2  # of each suite's items, never trained on: the evaluation's share


def is_held_out(item: EvalItem) -> bool:
    """A split by the item's key alone: the same items are held out in every run, whatever the
    seed, so ``conductor eval --held-out`` never scores an item a Conductor trained on. A
    table's question with a split is held out when it is in its test set: results on a
    source's test set compare with those published on it."""
    split = item.metadata.get("split") if item.kind is AnswerKind.REPLAY else None
    if split in ("train", "test"):
        return bool(split == "test")
    digest = hashlib.sha256(item.key.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < HELD_OUT_SHARE


def split_items(
    suites: Sequence[str], *, limit: int | None, seed: int
) -> tuple[list[EvalItem], list[EvalItem]]:
    """(training items, held-out items) of each suite, at most ``limit`` training items each:
    a seeded sample of its training items, not its first ones (an outcome table lists its
    questions benchmark by benchmark, so the first 600 of RouterBench's are all ARC)."""
    train: list[EvalItem] = []
    held: list[EvalItem] = []
    for suite in suites:
        items = load_suite(suite, seed=seed)
        training = [i for i in items if not is_held_out(i)]
        if limit is not None and limit < len(training):
            training = random.Random(seed).sample(training, limit)
        train += training
        held += [i for i in items if is_held_out(i)]
    return train, held
