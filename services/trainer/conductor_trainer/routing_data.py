"""conductor-mini's router trained from ``conductor eval`` results and traces, and the report
that says whether it learned anything.

The data: every item an evaluation ran with ``single:NAME`` strategies gives, per worker, right
or wrong (or a recorded share of right answers) and what it cost; every question of an outcome
table gives the recorded score and cost of each worker recorded on it (the pool names are the
workers' slugs, as ``--pool replay:TABLE`` names them, and the table's test split is held
out); a traced one-step workflow with feedback or a reference label gives it for the one
worker that ran (``trace_routing``), the others unknown. The router and its
``knn`` and ``cluster`` baselines (conductor_router fits them, from these arrays) learn on the
items outside the held-out split (the same split by item key as ``conductor train`` and
``conductor eval --held-out``) and are judged on the held-out ones, each through the same
``Router`` that serving and ``conductor eval --strategies router:FILE`` use.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from conductor.errors import ConfigurationError
from conductor_evaluation import (
    EvalItem,
    ItemResult,
    ResultStore,
    is_held_out,
    load_suite,
    read_outcome_table,
    worker_slug,
)
from conductor_router import (
    HeadChoice,
    Progress,
    QuestionEmbedder,
    Router,
    RouterModel,
    embed_questions,
    fit_routers,
    held_out_report,
)
from conductor_trainer.router_mlp import TorchMlpFitter

SINGLE = "single:"


@dataclass
class RoutingData:
    """Items with, per worker, the share of right answers over the evaluations that ran it
    (1.0 or 0.0 from one evaluation; nan: not run), and the mean cost."""

    items: list[EvalItem]
    workers: list[str]
    right: npt.NDArray[np.float64]  # (items, workers)
    cost: npt.NDArray[np.float64]  # (items, workers), USD per question

    @property
    def held_out(self) -> npt.NDArray[np.bool_]:
        return np.array([is_held_out(item) for item in self.items])

    @property
    def domains(self) -> list[str]:
        """Each item's domain: its outcome table's domain, else its suite (its benchmark)."""
        return [str(item.metadata.get("domain") or item.suite) for item in self.items]


def routing_data(eval_dirs: Sequence[Path]) -> RoutingData:
    """The ``single:*`` results of one or more evaluation directories, with their items. The
    same item evaluated several times (the simulator with other seeds, a provider's answers on
    other days) counts as the share of its right answers: a softer, truer label than one roll."""
    results: list[ItemResult] = []
    for eval_dir in eval_dirs:
        found = [r for r in ResultStore(eval_dir).load() if r.strategy.startswith(SINGLE)]
        if not found:
            raise ConfigurationError(
                f"{eval_dir}: no single-worker results to learn from; run `conductor eval "
                f"--strategies 'single:*' --out {eval_dir}` first"
            )
        # A harness error says nothing of the worker; an unrecorded replay is not "wrong".
        results += [r for r in found if r.status not in ("error", "unrecorded")]
    workers = sorted({r.strategy.removeprefix(SINGLE) for r in results})
    column = {worker: j for j, worker in enumerate(workers)}
    by_item: dict[tuple[str, str], list[ItemResult]] = {}
    for r in results:
        by_item.setdefault((r.suite, r.item_id), []).append(r)
    items = _items(eval_dirs, sorted({suite for suite, _ in by_item}), set(by_item))
    right = np.zeros((len(items), len(workers)))
    cost = np.zeros((len(items), len(workers)))
    runs = np.zeros((len(items), len(workers)))
    for i, item in enumerate(items):
        for r in by_item[(item.suite, item.id)]:
            j = column[r.strategy.removeprefix(SINGLE)]
            right[i, j] += r.correct if r.score is None else r.score
            cost[i, j] += r.cost_usd
            runs[i, j] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return RoutingData(items, workers, right / runs, cost / runs)


def table_routing_data(path: Path) -> RoutingData:
    """Every question of an outcome table with, per recorded worker (named by its slug, as a
    replay pool names it), its recorded score and cost (NaN where not recorded)."""
    table = read_outcome_table(path)
    names = {worker: worker_slug(worker) for worker in table.workers}
    if len(set(names.values())) != len(names):
        raise ConfigurationError(f"{path}: two recorded workers have the same slug: {names}")
    items = load_suite(f"table:{path}")
    workers = sorted(names, key=names.__getitem__)
    right = np.full((len(items), len(workers)), np.nan)
    cost = np.full((len(items), len(workers)), np.nan)
    for i, item in enumerate(items):
        outcomes = table.by_id[item.id].outcomes
        for j, worker in enumerate(workers):
            outcome = outcomes.get(worker)
            if outcome is not None and outcome.score is not None:
                right[i, j] = outcome.score
                cost[i, j] = np.nan if outcome.cost_usd is None else outcome.cost_usd
    if np.isnan(cost[~np.isnan(right)]).any():
        raise ConfigurationError(
            f"{path}: some recorded scores have no recorded cost; the router needs both"
        )
    return RoutingData(items, [names[w] for w in workers], right, cost)


def combine_routing_data(parts: Sequence[RoutingData]) -> RoutingData:
    """One set of items over every worker of the parts (nan where a part's worker did not run);
    the parts' items must be distinct (evaluated items and traced workflows are)."""
    workers = sorted({worker for part in parts for worker in part.workers})
    column = {worker: j for j, worker in enumerate(workers)}
    items = [item for part in parts for item in part.items]
    right = np.full((len(items), len(workers)), np.nan)
    cost = np.full((len(items), len(workers)), np.nan)
    start = 0
    for part in parts:
        rows = slice(start, start + len(part.items))
        columns = [column[worker] for worker in part.workers]
        right[rows, columns], cost[rows, columns] = part.right, part.cost
        start = rows.stop
    return RoutingData(items, workers, right, cost)


def _items(
    eval_dirs: Sequence[Path], suites: list[str], keys: set[tuple[str, str]]
) -> list[EvalItem]:
    items: list[EvalItem] = []
    for suite in suites:
        try:
            loaded = load_suite(suite)
        except ConfigurationError as exc:
            message = f"the evaluated suite {suite} cannot be loaded: {exc}"
            raise ConfigurationError(message) from exc
        items += [item for item in loaded if (item.suite, item.id) in keys]
    if not items:
        names = ", ".join(str(d) for d in eval_dirs)
        raise ConfigurationError(f"{names}: none of the items evaluated are in their suites")
    return items


def train_router(
    data: RoutingData,
    embedder: QuestionEmbedder,
    *,
    cost_weight: float = 0.0,
    progress: Progress | None = None,
    head: HeadChoice = "auto",
) -> tuple[dict[str, RouterModel], dict[str, Any]]:
    """The router (a logistic head per worker or an mlp head, as ``head`` says; ``auto``: the
    one cross-validation on the training items prefers) and the ``knn`` and ``cluster``
    baselines, all fitted on the training items and keyed by their names in the report, and the
    report on the held-out items, which says which head the router got and why (``head``)."""
    questions = [item.question for item in data.items]
    embeddings = embed_questions(embedder, questions, progress)
    held = data.held_out
    if held.all() or not held.any():
        raise ConfigurationError(
            "the items fall all on one side of the held-out split: evaluate more items "
            "(--limit) or give more traces, so that both training and held-out items exist"
        )
    trained = {
        "suites": sorted({item.suite for item in data.items}),
        "training_items": int((~held).sum()),
        "held_out_items": int(held.sum()),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    models = fit_routers(
        questions,
        embeddings,
        workers=data.workers,
        right=data.right,
        cost=data.cost,
        train=~held,
        embedder=embedder,
        cost_weight=cost_weight,
        domains=data.domains,
        trained=trained,
        progress=progress,
        head=head,
        mlp=TorchMlpFitter(),
    )
    routers = {name: Router(model, embedder) for name, model in models.items()}
    report = held_out_report(
        questions,
        embeddings,
        workers=data.workers,
        right=data.right,
        cost=data.cost,
        held=held,
        routers=routers,
    )
    return models, {**report, "head": head_choice(models["router"])}


def head_choice(model: RouterModel) -> dict[str, Any]:
    """Which head the router got, how it was chosen, and each candidate's mean score in
    cross-validation on the training items (none: too few to fold): its area under the
    accuracy/cost curve, or where every worker costs the same on each question its accuracy
    (``cv_measure``)."""
    trained = model.trained
    return {
        "chosen": model.head,
        "asked": trained.get("head_choice"),
        "cv_folds": trained.get("head_cv_folds", 0),
        "cv_measure": trained.get("head_cv_measure"),
        "cv": trained.get("head_cv", {}),
    }
