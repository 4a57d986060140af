"""A routing-aware warm-up: supervised target plans whose worker comes from labels.

The format warm-up (warmup.py) teaches the three lists with random workers, and GRPO is then
left to discover routing: with groups of 8 samples and one reward per plan it did not (a run on
the simulated mixed suite sent every question to the strongest worker). Here each training
question's target is a one-step plan on a *labelled* worker, with a subtask written from a
template for the question's kind, so GRPO starts from a Conductor that already routes and
improves on it.

Labels, for training questions only (held-out items are never labelled):
- ``outcomes:PATH[:WEIGHT]``: an outcome table, or a ``conductor eval`` directory with
  ``single:*`` results: per question, the worker whose single call earns the most under the
  cost-aware reward at WEIGHT (0.5 + 0.5 x score - WEIGHT x its cost over the question's
  dearest call; ties go to the cheaper worker). WEIGHT 0: the best-scoring worker.
- ``router:FILE[:WEIGHT]``: a trained router's choice (``conductor router train``) at WEIGHT,
  or at the file's own weight. A router generalises; per-question outcome labels carry each
  question's luck (which worker happened to be right on it).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor.errors import ConfigurationError
from conductor.pool import Domain
from conductor.ports import PromptForm
from conductor.workflow import Plan, PlanStep
from conductor_evaluation import AnswerKind, EvalItem, is_held_out
from conductor_trainer.warmup import target_completion

OUTCOMES, ROUTER = "outcomes", "router"
REASON = "This question suits one model best; it answers alone."
# One subtask per kind of question. Short (the plan must fit the completion budget) and not one
# of the few-shot examples' subtasks (a copied example subtask is an invalid plan).
MATH_SUBTASK = "Solve step by step."
CHOICE_SUBTASK = "Give the right option's letter."
CODE_SUBTASK = "Write the Python function."
GENERAL_SUBTASK = "Solve the question."
_KEYWORDS = (  # for outcome tables, whose domains are their benchmarks' names
    (CODE_SUBTASK, ("mbpp", "humaneval", "code")),
    (CHOICE_SUBTASK, ("arc", "mmlu", "winogrande", "hellaswag", "ceval", "c-eval", "choice")),
    (MATH_SUBTASK, ("gsm", "math")),
)


@dataclass(frozen=True)
class LabelSource:
    kind: str  # OUTCOMES or ROUTER
    path: Path
    cost_weight: float | None  # None: the router file's own (outcomes: 0)

    @classmethod
    def parse(cls, spec: str) -> LabelSource:
        kind, sep, rest = spec.partition(":")
        if not sep or kind not in (OUTCOMES, ROUTER) or not rest:
            raise ConfigurationError(
                f"--warmup-labels {spec!r}: use outcomes:PATH[:WEIGHT] (an outcome table or a "
                "conductor eval directory) or router:FILE[:WEIGHT]"
            )
        weight: float | None = None
        head, _, tail = rest.rpartition(":")
        with contextlib.suppress(ValueError):  # no number after the last colon: all is a path
            weight, rest = float(tail), head
        if weight is not None and not (math.isfinite(weight) and weight >= 0):
            raise ConfigurationError(f"--warmup-labels {spec!r}: the weight must be a number >= 0")
        path = Path(rest)
        if not path.exists():
            raise ConfigurationError(f"--warmup-labels {spec!r}: {path} does not exist")
        return cls(kind, path, weight)


def routing_labels(
    source: LabelSource, items: Sequence[EvalItem], workers: Sequence[str]
) -> dict[str, str]:
    """Per training item's key, the worker (one of ``workers``) its target plan routes to.
    Items the source says nothing of (and held-out items) get none."""
    training = [item for item in items if not is_held_out(item)]
    if source.kind == ROUTER:
        return _router_labels(source, training, workers)
    return _outcome_labels(source, training, workers)


def _router_labels(
    source: LabelSource, items: Sequence[EvalItem], workers: Sequence[str]
) -> dict[str, str]:
    from conductor_router import QuestionEmbedder, Router, load_router_model

    router = Router(load_router_model(source.path), QuestionEmbedder())
    labels = {}
    for item in items:
        decision = router.choose(item.question, allowed=workers, cost_weight=source.cost_weight)
        if decision is None:
            raise ConfigurationError(
                f"--warmup-labels: the router {source.path} knows none of the pool's workers"
            )
        labels[item.key] = decision.worker
    return labels


def _outcome_labels(
    source: LabelSource, items: Sequence[EvalItem], workers: Sequence[str]
) -> dict[str, str]:
    import numpy as np

    from conductor_trainer.routing_data import routing_data, table_routing_data

    data = routing_data([source.path]) if source.path.is_dir() else table_routing_data(source.path)
    weight = source.cost_weight or 0.0
    columns = [j for j, worker in enumerate(data.workers) if worker in workers]
    if not columns:
        raise ConfigurationError(
            f"--warmup-labels: {source.path} records none of the pool's workers "
            f"({', '.join(workers)}); it has {', '.join(data.workers)}"
        )
    row_of = {item.key: i for i, item in enumerate(data.items)}
    labels = {}
    for item in items:
        i = row_of.get(item.key)
        if i is None:
            continue
        score, cost = data.right[i, columns], data.cost[i, columns]
        known = ~np.isnan(score)
        if not known.any():
            continue
        cost = np.where(np.isnan(cost), 0.0, cost)
        dearest = float(cost[known].max())
        relative = cost / dearest if dearest > 0 else np.zeros_like(cost)
        reward = np.where(known, 0.5 + 0.5 * score - weight * relative, -np.inf)
        best = np.flatnonzero(reward == reward.max())
        labels[item.key] = data.workers[columns[int(best[np.argmin(cost[best])])]]
    return labels


def subtask_for(item: EvalItem) -> str:
    """The target plan's subtask for ``item``: by its answer kind or domain, else by the
    benchmark an outcome table names."""
    if item.kind is AnswerKind.CODE or item.domain is Domain.CODE:
        return CODE_SUBTASK
    if item.kind is AnswerKind.CHOICE:
        return CHOICE_SUBTASK
    if item.kind is AnswerKind.MATH or item.domain is Domain.MATH:
        return MATH_SUBTASK
    name = str(item.metadata.get("domain") or item.suite).casefold()
    for subtask, words in _KEYWORDS:
        if any(word in name for word in words):
            return subtask
    return GENERAL_SUBTASK


def routing_examples(
    rows: Iterable[Mapping[str, Any]],
    items: Mapping[str, EvalItem],
    labels: Mapping[str, str],
    form: PromptForm,
) -> list[dict[str, str]]:
    """Prompt-completion pairs: each training prompt (rendered in ``form``) whose question is
    labelled, with a one-step plan on its labelled worker (numbered as that prompt's pool
    numbers it)."""
    examples = []
    for row in rows:
        worker = labels.get(row["item_key"])
        if worker is None or worker not in row["pool_names"]:
            continue  # unlabelled, or its worker not shown to this prompt (randomised pools)
        step = PlanStep(
            model_id=list(row["pool_names"]).index(worker),
            subtask=subtask_for(items[row["item_key"]]),
        )
        plan = Plan(steps=(step,))
        examples.append(
            {"prompt": row["prompt"], "completion": target_completion(REASON, plan, form)}
        )
    if not examples:
        raise ConfigurationError(
            "--warmup-labels labels none of the training questions with a worker of the pool"
        )
    return examples


def label_shares(labels: Mapping[str, str]) -> dict[str, float]:
    """Each worker's share of the labels: the routing prior the warm-up teaches."""
    counts: dict[str, int] = {}
    for worker in labels.values():
        counts[worker] = counts.get(worker, 0) + 1
    return {worker: count / len(labels) for worker, count in sorted(counts.items())}
