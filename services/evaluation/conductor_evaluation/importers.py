"""Importers: public routing datasets' recorded outcomes of real LLMs, as outcome tables.

RouterBench (CSV: per prompt, each model's 0/1 score, response and cost) and RouterDC (JSON:
per question, each model's share of sampled answers right, nothing else) record different
things; each importer keeps what its source recorded and leaves the rest null ("not
recorded"). A file that does not fit is refused with a ConfigurationError naming the file,
the line (or item) and the field, before anything is written.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TextIO, get_args

from pydantic import ValidationError

from conductor.errors import ConfigurationError
from conductor.yaml_files import load_yaml_file
from conductor_evaluation.outcomes import Outcome, OutcomeRow, Split, read_outcome_table

Source = Literal["routerbench", "routerdc", "table"]
SOURCES: Final[tuple[str, ...]] = get_args(Source)


@dataclass(frozen=True)
class Price:
    """A model's price in USD per million tokens."""

    input: float
    output: float

    def estimate(self, question: str) -> float:
        """USD for one answer to ``question``, from token counts estimated with
        CHARS_PER_TOKEN and COMPLETION_TOKENS."""
        prompt_tokens = math.ceil(len(question) / CHARS_PER_TOKEN)
        return (prompt_tokens * self.input + COMPLETION_TOKENS * self.output) / 1_000_000


# RouterDC records no tokens, so its cost is estimated: English text averages about four
# characters a token, and a fixed answer length stands for every answer. The estimates only
# price the answer; the table's token fields stay null (not recorded).
CHARS_PER_TOKEN: Final = 4
COMPLETION_TOKENS: Final = 256

# A chosen assumption, not a recorded price: USD per million input and output tokens by
# parameter count, the usual price class of hosted open 7-8B models.
SIZE_CLASS_PRICES: Final[Mapping[str, Price]] = {
    "7B": Price(input=0.20, output=0.20),
    "8B": Price(input=0.20, output=0.20),
}
ROUTERDC_MODEL_SIZES: Final[Mapping[str, str]] = {
    "mistralai/Mistral-7B-v0.1": "7B",
    "meta-math/MetaMath-Mistral-7B": "7B",
    "itpossible/Chinese-Mistral-7B-v0.1": "7B",
    "HuggingFaceH4/zephyr-7b-beta": "7B",
    "cognitivecomputations/dolphin-2.6-mistral-7b": "7B",
    "meta-llama/Meta-Llama-3-8B": "8B",
    "cognitivecomputations/dolphin-2.9-llama3-8b": "8B",
}
# Every model of RouterDC's set lands in the same price class: cost does not separate them.
ROUTERDC_PRICES: Final[Mapping[str, Price]] = {
    model: SIZE_CLASS_PRICES[size] for model, size in ROUTERDC_MODEL_SIZES.items()
}

ROUTERBENCH_REQUIRED: Final = ("sample_id", "prompt", "eval_name")
# The unnamed first column is a pandas index; the oracle column is RouterBench's own routing.
ROUTERBENCH_IGNORED: Final = ("", "oracle_model_to_route_to")
_RESPONSE, _COST = "model_response", "total_cost"
_ROUTERDC_KEYS: Final = frozenset({"question", "scores", "cluster_id"})


@dataclass
class Imported:
    """The combined rows of the files imported, in file order, and what the reader should know
    about how they were combined."""

    rows: list[OutcomeRow]
    notes: list[str] = field(default_factory=list)


def import_outcomes(
    source: Source,
    paths: Sequence[Path],
    *,
    split: Split | None = None,
    prices: Mapping[str, Price] | None = None,
) -> Imported:
    """The rows of every file in ``paths``, ids unique across them. ``split`` overrides the
    split each file's name gives (RouterBench, RouterDC) or each row has (tables); ``prices``
    overrides RouterDC's price table per model."""
    if not paths:
        raise ConfigurationError("no files to import")
    if prices is not None and source != "routerdc":
        raise ConfigurationError("prices apply to RouterDC files only (the others record cost)")
    placed: Iterable[_Placed]
    if source == "routerbench":
        placed = (p for path in paths for p in _routerbench_file(path, split))
    elif source == "routerdc":
        price_table = {**ROUTERDC_PRICES, **(prices or {})}
        placed = (p for path in paths for p in _routerdc_file(path, split, price_table))
    else:
        placed = (p for path in paths for p in _table_file(path, split))
    # RouterBench records some questions on two rows, each model scored on one of them.
    imported = _combine(placed, merge_split_rows=source == "routerbench")
    if not imported.rows:
        raise ConfigurationError(f"{', '.join(map(str, paths))}: no questions")
    return imported


def read_prices(path: Path) -> dict[str, Price]:
    """A price file, YAML or JSON: ``{model: {input: X, output: Y}}`` in USD per million
    tokens."""
    data = load_yaml_file(path, "price file")
    shape = "{model: {input: X, output: Y}} in USD per million tokens"
    if not isinstance(data, dict) or not data:
        raise ConfigurationError(f"{path}: expected {shape}")
    prices: dict[str, Price] = {}
    for model, entry in data.items():
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError(f"{path}: model {model!r}: not a model name")
        if not isinstance(entry, dict) or set(entry) != {"input", "output"}:
            raise ConfigurationError(f"{path}: field {model}: expected {{input: X, output: Y}}")
        for key in ("input", "output"):
            if _number(entry[key]) is None or entry[key] < 0:
                raise ConfigurationError(
                    f"{path}: field {model}.{key}: {entry[key]!r} is not a price "
                    "(USD per million tokens, 0 or more)"
                )
        prices[model] = Price(input=float(entry["input"]), output=float(entry["output"]))
    return prices


# -- combining files -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Placed:
    """A row, where it was read ("file:line" or "file: item N") and the name its id has
    there, for messages."""

    row: OutcomeRow
    where: str
    id_field: str = "field id"


def _combine(placed: Iterable[_Placed], *, merge_split_rows: bool) -> Imported:
    by_id: dict[str, _Placed] = {}
    merged: list[str] = []
    across_splits = 0
    for item in placed:
        first = by_id.get(item.row.id)
        if first is None:
            by_id[item.row.id] = item
            continue
        conflict = _merge_conflict(first.row, item.row) if merge_split_rows else ""
        if conflict or not merge_split_rows:
            why = f" ({conflict})" if conflict else ""
            raise ConfigurationError(
                f"{item.where}: {item.id_field}: {item.row.id!r} already on {first.where}{why}"
            )
        by_id[item.row.id] = _Placed(_merged(first.row, item.row), first.where, first.id_field)
        merged.append(item.row.id)
        across_splits += {first.row.split, item.row.split} == {"train", "test"}
    notes = []
    if merged:
        examples = ", ".join(merged[:3]) + (", ..." if len(merged) > 3 else "")
        notes.append(
            f"{len(merged)} question(s) recorded on two rows, each model scored on at most one, "
            f"merged into one row each: {examples}"
        )
    if across_splits:
        notes.append(
            f"{across_splits} of them were in both a train and a test file: kept as test, so "
            "no router trains on a question it is judged on"
        )
    return Imported([p.row for p in by_id.values()], notes)


def _merge_conflict(first: OutcomeRow, second: OutcomeRow) -> str:
    """Why two rows of one id are not one question split over two rows; empty if they are."""
    if first.question != second.question:
        return "a different question"
    if first.domain != second.domain:
        return f"domain {second.domain!r}, there {first.domain!r}"
    for worker, outcome in second.outcomes.items():
        other = first.outcomes.get(worker)
        if other is not None and None not in (other.score, outcome.score) and other != outcome:
            return f"both record worker {worker!r}"
    return ""


def _merged(first: OutcomeRow, second: OutcomeRow) -> OutcomeRow:
    """The two rows as one: each worker's scored outcome, in the test split when either row
    was (no router may train on a question it is judged on)."""
    outcomes = dict(first.outcomes)
    for worker, outcome in second.outcomes.items():
        have = outcomes.get(worker)
        if have is None or (have.score is None and outcome.score is not None):
            outcomes[worker] = outcome
    splits = {first.split, second.split} - {None}
    split = "test" if "test" in splits else next(iter(splits), None)
    return first.model_copy(update={"outcomes": outcomes, "split": split})


# -- RouterBench -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Header:
    names: list[str]
    models: list[str]


def _routerbench_file(path: Path, split: Split | None) -> Iterator[_Placed]:
    """A RouterBench CSV: ``,sample_id,prompt,eval_name``, then per model a 0/1 score column
    (empty: not recorded), ``MODEL|model_response`` and ``MODEL|total_cost``."""
    split = split or _split_suffix(path.stem, "_-")[1]
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # prompts with few-shot examples are long
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        try:
            header = _routerbench_header(path, next(reader, None))
            for record in reader:
                where = f"{path}:{reader.line_num}"
                if not any(cell.strip() for cell in record):
                    continue
                if len(record) != len(header.names):
                    raise ConfigurationError(
                        f"{where}: {len(record)} cells, the header has {len(header.names)}"
                    )
                cells = dict(zip(header.names, record, strict=True))
                try:
                    row = _routerbench_row(cells, header.models, split)
                except _RecordError as exc:
                    raise ConfigurationError(f"{where}: {exc}") from None
                yield _Placed(row, where, "column sample_id")
        except csv.Error as exc:
            raise ConfigurationError(f"{path}:{reader.line_num}: not CSV ({exc})") from None
        except UnicodeDecodeError as exc:
            raise ConfigurationError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _routerbench_header(path: Path, names: list[str] | None) -> _Header:
    if not names:
        raise ConfigurationError(f"{path}: empty (expected a RouterBench CSV header)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigurationError(f"{path}:1: column {repeated[0]}: appears twice")
    missing = [n for n in ROUTERBENCH_REQUIRED if n not in names]
    if missing:
        raise ConfigurationError(f"{path}:1: missing column(s) {', '.join(missing)}")
    fixed = (*ROUTERBENCH_REQUIRED, *ROUTERBENCH_IGNORED)
    models = [n for n in names if "|" not in n and n not in fixed]
    if not models:
        raise ConfigurationError(f"{path}:1: no model columns (one 0/1 column per model)")
    for name in names:
        model, _, suffix = name.rpartition("|")
        if model and (suffix not in (_RESPONSE, _COST) or model not in models):
            raise ConfigurationError(
                f"{path}:1: column {name}: unknown (a model's columns are MODEL, "
                f"MODEL|{_RESPONSE} and MODEL|{_COST})"
            )
    return _Header(names, models)


def _routerbench_row(cells: dict[str, str], models: list[str], split: Split | None) -> OutcomeRow:
    for name in ROUTERBENCH_REQUIRED:
        if not cells[name].strip():
            raise _RecordError(f"column {name}: empty")
    outcomes: dict[str, Outcome] = {}
    for model in models:
        outcome = Outcome(
            score=_binary(model, cells[model]),
            cost_usd=_cost(f"{model}|{_COST}", cells.get(f"{model}|{_COST}", "")),
            response=_response(cells.get(f"{model}|{_RESPONSE}", "")),
        )
        if outcome != Outcome():  # nothing recorded: the model is left out
            outcomes[model] = outcome
    return _row(
        id=cells["sample_id"].strip(),
        question=_prompt(cells["prompt"]),
        domain=cells["eval_name"].strip(),
        split=split,
        outcomes=outcomes,
    )


def _prompt(cell: str) -> str:
    """The prompt cell, a Python list literal of strings, as one text. RouterBench writes some
    prompts twice in the list: a repeated prompt is one prompt; different ones are joined by
    a blank line."""
    value = _literal(cell)
    if not _strings(value) or not "".join(value).strip():
        raise _RecordError(f"column prompt: not a Python list of strings ({_clip(cell)})")
    return value[0] if len(set(value)) == 1 else "\n\n".join(value)


def _response(cell: str) -> str | None:
    """A response cell: the strings of a Python list literal (most cells), else the text."""
    if not cell:
        return None
    value = _literal(cell)
    return "\n\n".join(value) if _strings(value) else cell


def _binary(column: str, cell: str) -> float | None:
    if not cell.strip():
        return None
    value = _float(cell)
    if value not in (0.0, 1.0):
        raise _RecordError(f"column {column}: {_clip(cell)} is not 0 or 1 (empty: not recorded)")
    return value


def _cost(column: str, cell: str) -> float | None:
    if not cell.strip():
        return None
    value = _float(cell)
    if value is None or value < 0:
        raise _RecordError(f"column {column}: {_clip(cell)} is not a number")
    return value


# -- RouterDC --------------------------------------------------------------------------------


def _routerdc_file(
    path: Path, split: Split | None, prices: Mapping[str, Price]
) -> Iterator[_Placed]:
    """A RouterDC JSON file: a list of ``{"question", "scores": {model: share right},
    "cluster_id"?}``. Ids name the source record: domain, the file name's split (``all``:
    none) and the item's index, whatever ``split`` assigns."""
    domain, named_split = _routerdc_name(path)
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"{path}:{exc.lineno}: not JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(data, list):
        raise ConfigurationError(f"{path}: expected a JSON list of questions")
    for index, item in enumerate(data):
        row_id = f"{domain}.{named_split or 'all'}.{index}"
        try:
            row = _routerdc_row(item, row_id, domain, split or named_split, prices)
        except _RecordError as exc:
            line = _item_line(text, index)
            raise ConfigurationError(f"{path}:{line}: item {index}: {exc}") from None
        yield _Placed(row, f"{path}: item {index}")


def _routerdc_name(path: Path) -> tuple[str, Split | None]:
    """Domain and split from the file name: ``gsm8k-train.json`` is gsm8k, train;
    ``MATH_prealgebra.json`` is math-prealgebra, no split."""
    stem, split = _split_suffix(path.stem.lower(), "_-")
    return stem.replace("_", "-"), split


def _routerdc_row(
    item: Any, row_id: str, domain: str, split: Split | None, prices: Mapping[str, Price]
) -> OutcomeRow:
    if not isinstance(item, dict):
        raise _RecordError(f"expected an object, got {type(item).__name__}")
    unknown = sorted(set(item) - _ROUTERDC_KEYS)
    if unknown:
        raise _RecordError(
            f"field {unknown[0]}: unknown (an item has question, scores, cluster_id)"
        )
    for key in ("question", "scores"):
        if key not in item:
            raise _RecordError(f"field {key}: missing")
    question, scores = item["question"], item["scores"]
    if not isinstance(question, str) or not question.strip():
        raise _RecordError("field question: not a non-empty string")
    if not isinstance(scores, dict) or not scores:
        raise _RecordError("field scores: expected {model: share of answers right, 0 to 1}")
    if "cluster_id" in item and (type(item["cluster_id"]) is not int):
        raise _RecordError(f"field cluster_id: {item['cluster_id']!r} is not an integer")
    outcomes = {
        model: Outcome(
            score=_share(model, value), cost_usd=_price(model, prices).estimate(question)
        )
        for model, value in scores.items()
    }
    return _row(id=row_id, question=question, domain=domain, split=split, outcomes=outcomes)


def _share(model: str, value: Any) -> float:
    number = _number(value)
    if number is None:
        raise _RecordError(f"field scores.{model}: {value!r} is not a number")
    if not 0 <= number <= 1:
        raise _RecordError(f"field scores.{model}: {value!r} is not between 0 and 1")
    return number


def _price(model: str, prices: Mapping[str, Price]) -> Price:
    if model not in prices:
        raise _RecordError(
            f"field scores.{model}: no price for model {model!r} (give one with a price file: "
            "{model: {input: X, output: Y}} in USD per million tokens)"
        )
    return prices[model]


def _item_line(text: str, index: int) -> int:
    """The line item ``index`` of the JSON list in ``text`` (valid JSON) starts on."""
    decoder = json.JSONDecoder()
    end = text.index("[") + 1
    start = end
    for _ in range(index + 1):
        start = end
        while text[start] in " \t\r\n,":
            start += 1
        _, end = decoder.raw_decode(text, start)
    return text.count("\n", 0, start) + 1


# -- outcome tables --------------------------------------------------------------------------


def _table_file(path: Path, split: Split | None) -> Iterator[_Placed]:
    table = read_outcome_table(path)
    # read_outcome_table reads every non-blank line as one row, in order.
    lines = [n for n, line in enumerate(_read_text(path).split("\n"), 1) if line.strip()]
    for row, line in zip(table, lines, strict=True):
        placed = row if split is None else row.model_copy(update={"split": split})
        yield _Placed(placed, f"{path}:{line}")


# -- shared ----------------------------------------------------------------------------------


class _RecordError(Exception):
    """One record (a CSV row, a JSON item) is wrong; the file's reader adds where it is."""


def _row(**fields: Any) -> OutcomeRow:
    try:
        return OutcomeRow(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(part) for part in first["loc"])
        raise _RecordError(f"field {name}: {first['msg']}") from None


def _split_suffix(stem: str, separators: str) -> tuple[str, Split | None]:
    """``stem`` without a trailing ``_train``/``_test`` (any of ``separators``), and that
    split."""
    for split in get_args(Split):
        for separator in separators:
            if stem.lower().endswith(separator + split):
                return stem[: -len(separator + split)], split
    return stem, None


def _literal(cell: str) -> Any:
    try:
        return ast.literal_eval(cell)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(s, str) for s in value)


def _float(cell: str) -> float | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _number(value: Any) -> float | None:
    """A JSON/YAML number as a float; None for anything else (booleans included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _clip(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _open_text(path: Path) -> TextIO:
    try:
        return path.open(encoding="utf-8-sig", newline="")  # utf-8-sig: a leading BOM is no data
    except OSError as exc:
        raise ConfigurationError(f"{path}: {exc.strerror or exc}") from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigurationError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{path}: not UTF-8 text ({exc.reason})") from None
