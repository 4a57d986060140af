"""The evaluation harness: suites, verifiers, the code sandbox, the simulated provider, the
baseline strategies, the runner and its report (``conductor eval``).

What other services may use is exported here (the trainer scores its rollouts with the same
items, verifiers, simulator and reward); the modules themselves are this package's own.
"""

from conductor_evaluation.datasets import load_suite
from conductor_evaluation.harness import resolve_pool
from conductor_evaluation.importers import (
    ROUTERDC_PRICES,
    SOURCES,
    Imported,
    Price,
    Source,
    import_outcomes,
    read_prices,
)
from conductor_evaluation.items import AnswerKind, Domain, EvalItem, Verdict
from conductor_evaluation.outcomes import (
    Outcome,
    OutcomeRow,
    OutcomeTable,
    read_outcome_table,
    worker_slug,
    write_outcome_table,
)
from conductor_evaluation.results import ItemResult, ResultStore
from conductor_evaluation.reward import INVALID, method_reward
from conductor_evaluation.runner import judge
from conductor_evaluation.sim import simulating
from conductor_evaluation.split import is_held_out, split_items
from conductor_evaluation.strategies import given_outcome
from conductor_evaluation.verify import verify

__all__ = [
    "INVALID",
    "ROUTERDC_PRICES",
    "SOURCES",
    "AnswerKind",
    "Domain",
    "EvalItem",
    "Imported",
    "ItemResult",
    "Outcome",
    "OutcomeRow",
    "OutcomeTable",
    "Price",
    "ResultStore",
    "Source",
    "Verdict",
    "given_outcome",
    "import_outcomes",
    "is_held_out",
    "judge",
    "load_suite",
    "method_reward",
    "read_outcome_table",
    "read_prices",
    "resolve_pool",
    "simulating",
    "split_items",
    "verify",
    "worker_slug",
    "write_outcome_table",
]
