"""Outcome tables: recorded answers of real LLMs to the same questions, one format for every source.

A table is JSON Lines, one question per line::

    {"id": str, "question": str, "domain": str, "split": "train" | "test" | null,
     "outcomes": {WORKER: {"score": 0..1, "cost_usd": float | null,
                           "prompt_tokens": int | null, "completion_tokens": int | null,
                           "response": str | null, "latency_s": float | null}}}

A worker missing from ``outcomes``, or a null ``score``, means "not recorded", never "wrong".
``split`` is the table's own train/test split where its source has one (null: none given, and
the evaluation's held-out split by item key applies). Routing research judges routers on such
tables (RouterBench, RouterDC); the importers convert their files into this one shape, the
``replay`` provider answers from it, and the router learns from it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conductor.errors import ConfigurationError

Split = Literal["train", "test"]


class Outcome(BaseModel):
    """One worker's recorded result on one question."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # 1 right, 0 wrong; between: the share of sampled answers that were right. None: unknown.
    score: float | None = Field(default=None, ge=0, le=1)
    cost_usd: float | None = Field(default=None, ge=0)
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    response: str | None = None
    latency_s: float | None = Field(default=None, ge=0)

    @field_validator("score", "cost_usd", "latency_s")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class OutcomeRow(BaseModel):
    """One question of a table and what each recorded worker did with it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    domain: str = Field(min_length=1)
    split: Split | None = None
    outcomes: dict[str, Outcome]

    @field_validator("outcomes")
    @classmethod
    def _worker_names(cls, value: dict[str, Outcome]) -> dict[str, Outcome]:
        if any(not name.strip() for name in value):
            raise ValueError("worker names must not be empty")
        return value

    def score(self, worker: str) -> float | None:
        """The worker's recorded score; None when it is not recorded."""
        outcome = self.outcomes.get(worker)
        return None if outcome is None else outcome.score


class OutcomeTable:
    """A table's rows in file order, each id once."""

    def __init__(self, rows: Iterable[OutcomeRow], source: str = "") -> None:
        self.rows = list(rows)
        self.source = source
        self.by_id: dict[str, OutcomeRow] = {}
        for row in self.rows:
            if row.id in self.by_id:
                where = f"{source}: " if source else ""
                raise ConfigurationError(f"{where}id {row.id!r} appears twice")
            self.by_id[row.id] = row

    @property
    def workers(self) -> list[str]:
        """Every worker recorded on some question, in first-seen order."""
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(row.outcomes))
        return list(seen)

    @property
    def domains(self) -> list[str]:
        return list(dict.fromkeys(row.domain for row in self.rows))

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[OutcomeRow]:
        return iter(self.rows)


def worker_slug(name: str) -> str:
    """A pool name for recorded worker ``name``: lowercase, the part after its last ``/``
    (the vendor prefix goes), any character outside ``[a-z0-9._-]`` made ``-``. The caller
    checks that it is a valid pool name and unique: slugs of two names can collide."""
    return re.sub(r"[^a-z0-9._-]", "-", name.rsplit("/", 1)[-1].lower())


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(the line)"


def read_outcome_table(path: Path) -> OutcomeTable:
    """The table in ``path``; a ConfigurationError naming the file, line and field otherwise."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"{path}: {exc.strerror or exc}") from exc
    rows: list[OutcomeRow] = []
    seen: dict[str, int] = {}
    with handle:
        try:
            lines = list(handle)
        except UnicodeDecodeError as exc:
            raise ConfigurationError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(
                f"{path}:{number}: not JSON ({exc.msg} at column {exc.colno})"
            ) from exc
        if not isinstance(data, dict):
            raise ConfigurationError(
                f"{path}:{number}: expected an object, got {type(data).__name__}"
            )
        try:
            row = OutcomeRow.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigurationError(
                f"{path}:{number}: field {_field_path(first['loc'])}: {first['msg']}"
            ) from exc
        if row.id in seen:
            raise ConfigurationError(
                f"{path}:{number}: field id: {row.id!r} already on line {seen[row.id]}"
            )
        seen[row.id] = number
        rows.append(row)
    if not rows:
        raise ConfigurationError(f"{path}: no rows (an outcome table has one question a line)")
    return OutcomeTable(rows, source=str(path))


def write_outcome_table(rows: Iterable[OutcomeRow], path: Path) -> int:
    """Write ``rows`` as JSON Lines (through a temporary file, so a reader never sees half a
    table); the number of rows written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(row.model_dump_json() + "\n")
            count += 1
    tmp.replace(path)
    return count
