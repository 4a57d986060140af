"""The provider ``replay``: workers that answer a question of an outcome table with what a real
LLM answered then, at the cost, tokens and latency recorded.

A replay worker (``provider: replay``, ``table:`` the table's path, ``model:`` the recorded
worker's name) answers only the item being evaluated or trained on (``evaluating``), and only
when that item is a question of its own table (``table:PATH`` suites): there is nothing real to
answer anything else with. It answers with the recorded response, or, where none was recorded,
a line stating the recorded score; a worker with no recorded score on the question refuses
(not recorded is not wrong: the harness leaves such items out, see ``unrecorded_workers``).

No verifier reads the answer: a workflow is judged by the recorded score of the worker whose
answer is final (``replay_verdict``). No outcome was recorded for a worker shown other answers,
so a step that checks or aggregates gains nothing from them, and the figures of multi-step plans
are a lower bound.

Tokens are the recorded ones; where a count is missing, the prompt is estimated from the
messages as the simulator does (4 characters a token) and the completion from the recorded
response's length (0 without one). The cost is the recorded ``cost_usd`` (``Completion.cost_usd``
overrides the pool's price); where none was recorded, the pool's price of the tokens (0 unless
the pool file gives one).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conductor.chat import ChatMessage, Completion, Usage
from conductor.errors import ConfigurationError, ProviderRejected
from conductor.pool import Pool, Provider, WorkerSpec
from conductor.streaming import WholeAnswerStream
from conductor.workflow import StepKind, StepRecord, StepStatus, WorkflowRecord
from conductor_evaluation.items import AnswerKind, Domain, EvalItem, Verdict
from conductor_evaluation.outcomes import Outcome, OutcomeTable, read_outcome_table, worker_slug
from conductor_evaluation.sim import evaluated_task

TABLE_PREFIX = "table:"  # a suite made of an outcome table's questions: table:PATH[#DOMAIN]
POOL_PREFIX = "replay:"  # a pool of an outcome table's workers: replay:PATH

_tables: dict[str, tuple[tuple[int, int], OutcomeTable]] = {}
_tables_lock = threading.Lock()  # suites and workers load tables in threads


def table_path(path: str | Path) -> str:
    """The table's key: its resolved path, which replay items and workers compare."""
    return str(Path(path).expanduser().resolve())


def load_table(path: str | Path) -> OutcomeTable:
    """The table at ``path``, read once per process (by resolved path; read again only when
    the file has changed): a suite and every worker of its pool share one copy."""
    key = table_path(path)
    try:
        stat = Path(key).stat()
    except OSError as exc:
        raise ConfigurationError(f"{path}: {exc.strerror or exc}") from exc
    version = (stat.st_mtime_ns, stat.st_size)
    with _tables_lock:
        cached = _tables.get(key)
        if cached is None or cached[0] != version:
            cached = (version, read_outcome_table(Path(key)))
            _tables[key] = cached
        return cached[1]


# -- the worker -------------------------------------------------------------------------------


def _prompt_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(len(m.content) for m in messages) // 4 + 1  # the simulator's estimate


class ReplayWorker(WholeAnswerStream):
    """The ``replay`` provider's worker: one recorded worker of one outcome table."""

    def __init__(self, name: str, model: str, table: OutcomeTable) -> None:
        self.name = name
        self.model = model
        self.table = table

    @classmethod
    def from_spec(cls, spec: WorkerSpec) -> ReplayWorker:
        """A bad table, or a model it never recorded, stops the start, not the first call."""
        assert spec.table is not None  # WorkerSpec refuses a replay worker without its table
        table = load_table(spec.table)
        if spec.model not in table.workers:
            raise ConfigurationError(
                f"worker {spec.name!r}: {spec.model!r} is not recorded in {table.source} "
                f"(recorded: {', '.join(table.workers)})"
            )
        return cls(spec.name, spec.model, table)

    def outcome(self) -> Outcome:
        """The recorded outcome on the item being evaluated; ProviderRejected when there is
        no such item, it is not a question of this table, or this worker's score on it was not
        recorded."""
        task = evaluated_task()
        item = None if task is None else task.item
        row = None
        if item is not None and is_table_item(item, self.table.source):
            row = self.table.by_id.get(item.id)
        if row is None:
            why = (
                "none is being evaluated here"
                if item is None
                else f"{item.key} is not one of its questions"
            )
            raise ProviderRejected(
                f"worker {self.name!r} replays {self.model!r} from {self.table.source}: replay "
                f"workers answer only items of their table being evaluated, and {why}"
            )
        outcome = row.outcomes.get(self.model)
        if outcome is None or outcome.score is None:
            raise ProviderRejected(
                f"worker {self.name!r}: no score of {self.model!r} is recorded on question "
                f"{row.id!r} of {self.table.source} (not recorded, which is not wrong)"
            )
        return outcome

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        outcome = self.outcome()
        response = outcome.response
        text = (
            response
            if response is not None
            else f"[replay] {self.model} recorded score {outcome.score:g} on this question; "
            "no response was recorded"
        )
        usage = Usage(
            prompt_tokens=(
                _prompt_tokens(messages) if outcome.prompt_tokens is None else outcome.prompt_tokens
            ),
            completion_tokens=(
                (len(response or "") + 3) // 4
                if outcome.completion_tokens is None
                else outcome.completion_tokens
            ),
        )
        if outcome.latency_s:
            await asyncio.sleep(outcome.latency_s)
        return Completion(
            text=text,
            usage=usage,
            model=self.model,
            finish_reason="stop",
            cost_usd=outcome.cost_usd,
        )

    async def aclose(self) -> None:
        """Nothing to release."""


# -- suites and pools of a table --------------------------------------------------------------


def is_table_item(item: EvalItem, table: str) -> bool:
    """Whether ``item`` is a question of the table whose key (``table_path``) is ``table``."""
    return item.kind is AnswerKind.REPLAY and item.metadata.get("table") == table


def table_items(spec: str, *, suite: str) -> list[EvalItem]:
    """The questions of ``PATH`` or ``PATH#DOMAIN`` (rows of that domain only), in file order;
    each item's id is its row's id."""
    path_text, domain = spec, None
    if "#" in spec and not Path(spec).is_file():
        path_text, _, domain = spec.rpartition("#")
    table = load_table(path_text)
    rows = table.rows if domain is None else [r for r in table.rows if r.domain == domain]
    if not rows:
        raise ConfigurationError(
            f"{suite}: no question of domain {domain!r} in {table.source} "
            f"(domains: {', '.join(table.domains)})"
        )
    return [
        EvalItem(
            suite=suite,
            id=row.id,
            question=row.question,
            answer="",  # none: the recorded scores judge
            kind=AnswerKind.REPLAY,
            domain=Domain.GENERAL,
            metadata={"table": table.source, "domain": row.domain, "split": row.split},
        )
        for row in rows
    ]


@dataclass(frozen=True)
class RecordedWorker:
    """What a table recorded of one worker, over the questions where it is recorded."""

    name: str
    scored: int  # questions with a recorded score
    mean_score: float | None
    costed: int  # questions with a recorded cost
    mean_cost_usd: float | None


@functools.lru_cache(maxsize=8)
def recorded_workers(table: OutcomeTable) -> dict[str, RecordedWorker]:
    """Each recorded worker's mean score and mean cost, in the table's worker order, over the
    questions outside the table's test split: these figures describe the workers to the
    Conductor, which must learn nothing there of the questions it is judged on."""
    scores: dict[str, list[float]] = {w: [] for w in table.workers}
    costs: dict[str, list[float]] = {w: [] for w in table.workers}
    for row in table:
        if row.split == "test":
            continue
        for worker, outcome in row.outcomes.items():
            if outcome.score is not None:
                scores[worker].append(outcome.score)
            if outcome.cost_usd is not None:
                costs[worker].append(outcome.cost_usd)
    return {
        w: RecordedWorker(
            name=w,
            scored=len(scores[w]),
            mean_score=sum(scores[w]) / len(scores[w]) if scores[w] else None,
            costed=len(costs[w]),
            mean_cost_usd=sum(costs[w]) / len(costs[w]) if costs[w] else None,
        )
        for w in table.workers
    }


def _description(name: str, record: RecordedWorker) -> str:
    # Short: the Conductor's prompt lists every worker (RouterBench's 11 took 57 tokens each,
    # a third of the prompt without its examples, before these were cut to about 25).
    score = (
        "no recorded score"
        if record.mean_score is None
        else f"recorded score {record.mean_score:.2f}"
    )
    cost = (
        "no recorded cost"
        if record.mean_cost_usd is None
        else f"${record.mean_cost_usd * 1000:.3g} per 1k questions"
    )
    return f"{name}: {score}, {cost}."


def replay_pool(path: str | Path) -> Pool:
    """``--pool replay:TABLE``: one replay worker per recorded worker, named by its slug."""
    table = load_table(path)
    workers: list[WorkerSpec] = []
    by_slug: dict[str, str] = {}
    for record in recorded_workers(table).values():
        slug = worker_slug(record.name)
        if slug in by_slug:
            raise ConfigurationError(
                f"{table.source}: recorded workers {by_slug[slug]!r} and {record.name!r} "
                f"both make the pool name {slug!r}: rename one in the table, or write a pool "
                "file with provider 'replay' workers"
            )
        by_slug[slug] = record.name
        try:
            workers.append(
                WorkerSpec(
                    name=slug,
                    provider=Provider.REPLAY,
                    model=record.name,
                    table=table.source,
                    description=_description(slug, record),
                )
            )
        except ValueError as exc:  # pydantic's ValidationError: the name rule
            raise ConfigurationError(
                f"{table.source}: recorded worker {record.name!r} makes the pool name {slug!r}, "
                "which is not a valid worker name (1-64 characters of a-z, 0-9, '.', '_' or "
                "'-', starting with a letter or digit): write a pool file with provider "
                "'replay' workers instead"
            ) from exc
    return Pool(workers=tuple(workers))


def mean_recorded_cost(spec: WorkerSpec) -> float:
    """A replay worker's mean recorded cost per question (0 for other workers, or none
    recorded): how the strongest worker is guessed where a replay pool has no prices."""
    if spec.table is None:
        return 0.0
    record = recorded_workers(load_table(spec.table)).get(spec.model)
    return 0.0 if record is None or record.mean_cost_usd is None else record.mean_cost_usd


# -- judging ----------------------------------------------------------------------------------


def _answered_by(step: StepRecord) -> str:
    """The worker whose answer the step kept: a fallback's when one answered."""
    answered = [a.worker for a in step.attempts if a.status == "ok" and a.worker]
    return answered[-1] if answered else step.worker


def replay_verdict(item: EvalItem, workflow: WorkflowRecord, pool: Pool) -> Verdict:
    """A completed workflow on a table's question, judged by the recorded score of the worker
    whose answer is final (its last worker step's); a ConfigurationError when that worker is
    not a replay worker of the question's table, since nothing then judges it."""
    steps = [s for s in workflow.steps if s.kind is StepKind.WORKER]
    if not steps:
        return Verdict(correct=False, score=0.0, detail="no worker answered")
    name = _answered_by(steps[-1])
    spec = pool.find(name)
    if spec is None or spec.table is None or table_path(spec.table) != item.metadata.get("table"):
        raise ConfigurationError(
            f"{item.key}: the final answer came from {name!r}, not a replay worker of "
            f"{item.metadata.get('table')}: only a recorded score judges its questions"
        )
    row = load_table(spec.table).by_id.get(item.id)
    score = None if row is None else row.score(spec.model)
    if score is None:  # the worker refuses such questions; a table changed under the run
        raise ConfigurationError(f"{item.key}: no score of {spec.model!r} is recorded")
    return Verdict(
        correct=score >= 0.5,
        score=score,
        detail=f"recorded score of {spec.model} ({name}): {score:g}",
    )


def unrecorded_workers(item: EvalItem, workflow: WorkflowRecord, pool: Pool) -> list[str]:
    """The replay workers whose failed steps failed for want of a recorded score on ``item``:
    a workflow that needed them cannot be replayed on it, which is not a wrong answer."""
    table = item.metadata.get("table")
    row = None if table is None else load_table(table).by_id.get(item.id)
    if row is None:
        return []
    out: list[str] = []
    for step in workflow.steps:
        spec = pool.find(step.worker)
        if (
            step.kind is StepKind.WORKER
            and step.status is StepStatus.FAILED
            and spec is not None
            and spec.replayed
            and row.score(spec.model) is None
            and step.worker not in out
        ):
            out.append(step.worker)
    return out
