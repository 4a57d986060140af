"""Evaluation strategies: the Conductor and the baselines it must beat, on one executor and pool.

Baselines are fixed plans handed to the same executor the Conductor's plans run on (a planner
that writes the same plan whatever the question), so every strategy pays the same gateway,
retries, quotas and accounting, and the comparison is fair:

- ``single:NAME``: one step on one worker (``single:*``: one strategy per worker).
- ``reflect:NAME[:K]``: the worker answers, then reviews its own answer K times (default 2).
- ``moa[:A+B+C>AGG]``: Mixture-of-Agents: proposers answer independently, an aggregator sees
  them all and writes the answer (default: up to four workers, the priciest one aggregating;
  among replayed workers, the one with the highest mean recorded cost).
- ``random``: one step on a worker drawn at random per question (seeded).
- ``router:FILE[:WEIGHT]``: one step on the worker a trained router (``conductor router
  train``) picks per question, at its file's cost weight or WEIGHT.
- ``oracle``: per question, the best single worker (an upper bound for routing; computed from
  the ``single:*`` results, which it adds).
- any variant name (``conductor-mini``, ``conductor-ultra``, an operator variant): the Conductor.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from conductor.errors import ConfigurationError
from conductor.pool import Pool
from conductor.ports import PlanRequest
from conductor.variants import MAX_STEPS_LIMIT, Variant
from conductor.workflow import ALL, AccessEntry, Plan, PlanOutcome, PlanStep

if TYPE_CHECKING:  # the router needs the router extra (numpy, WordLlama): imported when used
    from conductor_router import Router

SOLVE = "Solve the question and give the final answer in the format the question asks for."
REVIEW = (
    "Review the answer above: check every step, fix any mistake, and give the corrected final "
    "answer in the format the question asks for."
)
AGGREGATE = (
    "Several answers to the question above are shown. Compare them, check which is right, and "
    "give one final answer in the format the question asks for."
)
DEFAULT_REFLECT_ROUNDS = 2
MOA_MAX_PROPOSERS = MAX_STEPS_LIMIT - 1


class Kind(StrEnum):
    CONDUCTOR = "conductor"
    SINGLE = "single"
    REFLECT = "reflect"
    MOA = "moa"
    RANDOM = "random"
    ROUTER = "router"
    ORACLE = "oracle"


@dataclass(frozen=True)
class Strategy:
    name: str  # as the report shows it: "conductor-ultra", "single:gpt", "reflect:gpt:2"
    kind: Kind
    workers: tuple[str, ...] = ()  # single/reflect: the worker; moa: proposers then aggregator
    rounds: int = 0  # reflect: review rounds
    variant: Variant | None = None  # conductor: the variant
    router: Path | None = None  # router: its file
    cost_weight: float | None = None  # router: None for the file's own
    seed: int = field(default=0, compare=False)

    @property
    def runs(self) -> bool:
        """Whether it runs workflows (the oracle is computed from the single workers' runs)."""
        return self.kind is not Kind.ORACLE


def parse_strategies(
    text: str, pool: Pool, variants: dict[str, Variant], *, seed: int = 0
) -> list[Strategy]:
    """Strategies from ``--strategies``; the oracle brings every ``single:*`` with it."""
    names = [w.name for w in pool.workers]
    out: list[Strategy] = []
    for spec in (s.strip() for s in text.split(",")):
        if not spec:
            continue
        for strategy in _parse_one(spec, pool, names, variants, seed):
            if strategy not in out:
                out.append(strategy)
    if not out:
        raise ConfigurationError("no strategy given (--strategies)")
    if any(s.kind is Kind.ORACLE for s in out):
        for name in names:
            single = Strategy(f"single:{name}", Kind.SINGLE, (name,), seed=seed)
            if single not in out:
                out.append(single)
    return out


def _parse_one(
    spec: str, pool: Pool, names: list[str], variants: dict[str, Variant], seed: int
) -> list[Strategy]:
    head, _, rest = spec.partition(":")
    if head == "single" and rest:
        workers = names if rest == "*" else [_known(rest, names, spec)]
        return [Strategy(f"single:{w}", Kind.SINGLE, (w,), seed=seed) for w in workers]
    if head == "reflect" and rest:
        worker, _, rounds_text = rest.partition(":")
        rounds = _int(rounds_text, spec) if rounds_text else DEFAULT_REFLECT_ROUNDS
        if not 1 <= rounds <= MAX_STEPS_LIMIT - 1:
            raise ConfigurationError(f"{spec}: review rounds are 1..{MAX_STEPS_LIMIT - 1}")
        worker = _known(worker, names, spec)
        return [Strategy(f"reflect:{worker}:{rounds}", Kind.REFLECT, (worker,), rounds, seed=seed)]
    if head == "moa":
        moa = _moa_workers(rest, pool, names, spec)
        label = f"moa:{'+'.join(moa[:-1])}>{moa[-1]}"
        return [Strategy(label, Kind.MOA, moa, seed=seed)]
    if spec == "random":
        return [Strategy("random", Kind.RANDOM, tuple(names), seed=seed)]
    if head == "router" and rest:
        return [_router_strategy(rest, names, spec, seed)]
    if spec == "oracle":
        return [Strategy("oracle", Kind.ORACLE, tuple(names), seed=seed)]
    if spec in variants:
        return [Strategy(spec, Kind.CONDUCTOR, variant=variants[spec], seed=seed)]
    raise ConfigurationError(
        f"unknown strategy {spec!r}: use a variant ({', '.join(sorted(variants))}), "
        "single:NAME, single:*, reflect:NAME[:K], moa[:A+B>AGG], random, router:FILE[:WEIGHT] "
        "or oracle"
    )


def _router_strategy(rest: str, names: list[str], spec: str, seed: int) -> Strategy:
    """``router:FILE`` or ``router:FILE:WEIGHT``; the file is loaded now, so a bad one stops
    the evaluation before anything runs."""
    path_text, weight = rest, None
    head, _, tail = rest.rpartition(":")
    with contextlib.suppress(ValueError):  # no number after the last colon: all of it is a path
        weight, path_text = float(tail), head
    if weight is not None and not (math.isfinite(weight) and weight >= 0):
        raise ConfigurationError(f"{spec}: the cost weight must be a number >= 0")
    from conductor_router import load_router_model

    path = Path(path_text)
    model = load_router_model(path)
    if not set(names) & {w.name for w in model.workers}:
        raise ConfigurationError(f"{spec}: the router knows none of the pool's workers")
    # The file's digest in the name: results are cached by strategy name, and a retrained
    # router under the same file name is another strategy.
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    label = f"router:{path.name}@{digest}" + (f":{weight:g}" if weight is not None else "")
    return Strategy(label, Kind.ROUTER, tuple(names), router=path, cost_weight=weight, seed=seed)


def _moa_workers(rest: str, pool: Pool, names: list[str], spec: str) -> tuple[str, ...]:
    if rest:
        proposers_text, sep, aggregator = rest.partition(">")
        proposers = [_known(n, names, spec) for n in proposers_text.split("+") if n]
        if not sep or not proposers:
            raise ConfigurationError(f"{spec}: write moa:A+B+C>AGGREGATOR")
        aggregator = _known(aggregator, names, spec)
    else:
        proposers = names[:MOA_MAX_PROPOSERS]
        # The priciest worker is taken as the strongest: the usual MoA set-up aggregates with
        # the best model. Name them explicitly when price is a poor guide. Replayed workers
        # have no price but a recorded cost: the costliest on average, among equal prices.
        from conductor_evaluation.replay import mean_recorded_cost

        aggregator = max(
            pool.workers,
            key=lambda w: (w.price.output, w.price.input, mean_recorded_cost(w)),
        ).name
    if len(proposers) > MOA_MAX_PROPOSERS:
        raise ConfigurationError(f"{spec}: at most {MOA_MAX_PROPOSERS} proposers (5 steps)")
    return (*proposers, aggregator)


def _known(name: str, names: list[str], spec: str) -> str:
    if name not in names:
        raise ConfigurationError(
            f"{spec}: no worker {name!r} in the pool (workers: {', '.join(names)})"
        )
    return name


def _int(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(f"{spec}: {text!r} is not a number of rounds") from None


def fixed_variant(strategy: Strategy, *, step_timeout_s: float) -> Variant:
    """The executor variant a baseline runs under: its own steps, no recursion."""
    steps = {Kind.REFLECT: 1 + strategy.rounds, Kind.MOA: len(strategy.workers)}
    return Variant(
        name=strategy.name,
        description=f"evaluation baseline {strategy.name}",
        max_steps=steps.get(strategy.kind, 1),
        recursion_rounds=0,
        step_timeout_s=step_timeout_s,
        workflow_timeout_s=step_timeout_s * MAX_STEPS_LIMIT * 2,
    )


def given_outcome(
    request: PlanRequest, plan: Plan, *, raw_output: str, backend: str
) -> PlanOutcome:
    """A plan decided outside the Conductor (a baseline's, a sampled one being scored) as the
    executor takes a planner's answer: valid, for the pool the request showed."""
    return PlanOutcome(
        round=request.round,
        raw_output=raw_output,
        valid=True,
        plan=plan,
        pool=request.pool,
        backend=backend,
    )


class FixedPlanner:
    """A planner that writes a baseline's plan for every question (the Planner port)."""

    def __init__(self, strategy: Strategy) -> None:
        if not strategy.runs or strategy.kind is Kind.CONDUCTOR:
            raise ValueError(f"{strategy.name} has no fixed plan")
        self.strategy = strategy
        self._router: Router | None = None
        if strategy.router is not None:
            from conductor_router import Router

            self._router = Router.load(strategy.router)

    async def plan(self, request: PlanRequest) -> PlanOutcome:
        plan = self.plan_for(request.question, [e.name for e in request.pool])
        return given_outcome(
            request,
            plan,
            raw_output=plan.as_lists_text(),
            backend=f"baseline:{self.strategy.kind.value}",
        )

    def plan_for(self, question: str, pool: Sequence[str]) -> Plan:
        s = self.strategy

        def step(worker: str, subtask: str, access: tuple[AccessEntry, ...] = ()) -> PlanStep:
            return PlanStep(model_id=pool.index(worker), subtask=subtask, access_list=access)

        # Only a round's first step is shown the question (the protocol), so later steps that
        # must answer it on their own carry it in their subtask.
        with_question = f"{question}\n\n{SOLVE}"
        match s.kind:
            case Kind.SINGLE:
                steps = [step(s.workers[0], SOLVE)]
            case Kind.RANDOM:
                digest = hashlib.sha256(f"{s.seed}\0{question}".encode()).digest()
                worker = random.Random(digest).choice(list(s.workers))
                steps = [step(worker, SOLVE)]
            case Kind.ROUTER:
                assert self._router is not None
                decision = self._router.choose(question, allowed=pool, cost_weight=s.cost_weight)
                if decision is None:
                    raise ConfigurationError(f"{s.name}: the router knows none of the workers")
                steps = [step(decision.worker, SOLVE)]
            case Kind.REFLECT:
                first = step(s.workers[0], SOLVE)
                steps = [first, *(step(s.workers[0], REVIEW, (ALL,)) for _ in range(s.rounds))]
            case Kind.MOA:
                *proposers, aggregator = s.workers
                steps = [
                    step(w, SOLVE if i == 0 else with_question) for i, w in enumerate(proposers)
                ]
                steps.append(step(aggregator, AGGREGATE, (ALL,)))
            case _:
                raise AssertionError(f"no fixed plan for {s.kind}")
        return Plan(steps=tuple(steps))
