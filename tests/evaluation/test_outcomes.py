"""Outcome tables from RouterBench and RouterDC files, and ``conductor outcomes import``: on
small files written here in each source's shape."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conductor.errors import ConfigurationError
from conductor_evaluation import (
    ROUTERDC_PRICES,
    Outcome,
    import_outcomes,
    read_outcome_table,
    read_prices,
    write_outcome_table,
)

from fakes.cli import run_conductor_here

MODELS = ["gpt", "llama"]
HEADER = [
    "",
    "sample_id",
    "prompt",
    "eval_name",
    *MODELS,
    *(f"{m}|model_response" for m in MODELS),
    *(f"{m}|total_cost" for m in MODELS),
    "oracle_model_to_route_to",
]
MISTRAL, LLAMA = "mistralai/Mistral-7B-v0.1", "meta-llama/Meta-Llama-3-8B"


def bench_row(sample_id: str, prompt: list[str], /, **cells: str) -> dict[str, str]:
    """A RouterBench row: gpt right, llama wrong, list-literal responses, unless
    ``cells`` (keyed by column name, ``|`` written ``__``) say otherwise."""
    row = {
        "": "7",
        "sample_id": sample_id,
        "prompt": repr(prompt),
        "eval_name": "arc-challenge",
        "gpt": "1.0",
        "llama": "0.0",
        "gpt|model_response": "['D']",
        "llama|model_response": "['B']",
        "gpt|total_cost": "0.0052",
        "llama|total_cost": "0.0001",
        "oracle_model_to_route_to": "gpt",
    }
    row.update({key.replace("__", "|"): value for key, value in cells.items()})
    return row


def write_bench(path: Path, rows: list[dict[str, str]], header: list[str] = HEADER) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_dc(path: Path, items: list[Any]) -> Path:
    """A RouterDC JSON list, item i on line i + 2."""
    path.write_text("[\n" + ",\n".join(json.dumps(i) for i in items) + "\n]\n", encoding="utf-8")
    return path


def dc_item(question: str = "What is 2 + 2?", /, **scores: float) -> dict[str, Any]:
    return {"question": question, "scores": scores or {MISTRAL: 0.8, LLAMA: 0.25}}


def table_line(row_id: str, score: Any = 1, **extra: Any) -> str:
    row = {
        "id": row_id,
        "question": f"question {row_id}",
        "domain": "math",
        "split": None,
        "outcomes": {"w": {"score": score}},
        **extra,
    }
    return json.dumps(row) + "\n"


def table_cells(text: str) -> list[list[str]]:
    """The cells of each body row of the rich tables in ``text``."""
    return [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in text.splitlines()
        if line.startswith("│")
    ]


# -- RouterBench -----------------------------------------------------------------------------


def test_a_routerbench_csv_round_trips_through_a_table(tmp_path: Path) -> None:
    source = write_bench(
        tmp_path / "arc_challenge_train.csv",
        [
            bench_row("arc.1", ["Which is a gas?\nA) ice\nB) steam"]),
            bench_row("arc.2", ["Pick one."], llama="", gpt__total_cost=""),
        ],
    )
    imported = import_outcomes("routerbench", [source])
    write_outcome_table(imported.rows, tmp_path / "t.jsonl")

    back = read_outcome_table(tmp_path / "t.jsonl")
    assert back.rows == imported.rows
    first, second = back.rows
    assert (first.id, first.question, first.domain, first.split) == (
        "arc.1",
        "Which is a gas?\nA) ice\nB) steam",
        "arc-challenge",
        "train",
    )
    assert first.outcomes == {
        "gpt": Outcome(score=1.0, cost_usd=0.0052, response="D"),
        "llama": Outcome(score=0.0, cost_usd=0.0001, response="B"),
    }
    # An empty score cell is "not recorded", never "wrong"; what else was recorded stays.
    assert second.outcomes["llama"] == Outcome(score=None, cost_usd=0.0001, response="B")
    assert second.outcomes["gpt"].cost_usd is None
    assert imported.notes == []


def test_routerbench_prompts_and_responses_are_unwrapped_from_list_literals(
    tmp_path: Path,
) -> None:
    source = write_bench(
        tmp_path / "mix.csv",
        [
            bench_row("a", ["Part one.", "Part two."], gpt__model_response="['x', 'y']"),
            bench_row("b", ["Asked twice.", "Asked twice."], gpt__model_response="plain text"),
            bench_row("c", ["Q"], gpt__model_response="[1, 2]", llama__model_response=""),
        ],
    )
    rows = {row.id: row for row in import_outcomes("routerbench", [source]).rows}

    assert rows["a"].question == "Part one.\n\nPart two."
    assert rows["a"].outcomes["gpt"].response == "x\n\ny"
    assert rows["b"].question == "Asked twice."  # a repeated prompt is one prompt
    assert rows["b"].outcomes["gpt"].response == "plain text"
    assert rows["c"].outcomes["gpt"].response == "[1, 2]"  # not strings: the cell as is
    assert rows["c"].outcomes["llama"].response is None
    assert {row.split for row in rows.values()} == {None}  # no _train/_test in the name


def test_split_comes_from_the_file_name_unless_overridden(tmp_path: Path) -> None:
    train = write_bench(tmp_path / "wino_train.csv", [bench_row("w.1", ["Q1"])])
    test = write_bench(tmp_path / "wino_test.csv", [bench_row("w.2", ["Q2"])])

    named = import_outcomes("routerbench", [train, test]).rows
    overridden = import_outcomes("routerbench", [train, test], split="test").rows

    assert [row.split for row in named] == ["train", "test"]
    assert [row.split for row in overridden] == ["test", "test"]


def test_a_question_split_over_two_rows_is_merged_and_kept_out_of_training(
    tmp_path: Path,
) -> None:
    test = write_bench(tmp_path / "arc_test.csv", [bench_row("arc.9", ["Q"], llama="", gpt="1.0")])
    train = write_bench(
        tmp_path / "arc_train.csv", [bench_row("arc.9", ["Q", "Q"], gpt="", llama="1.0")]
    )

    imported = import_outcomes("routerbench", [train, test])

    (row,) = imported.rows
    assert row.split == "test"
    assert (row.score("gpt"), row.score("llama")) == (1.0, 1.0)
    assert "1 question(s) recorded on two rows" in imported.notes[0]
    assert "kept as test" in imported.notes[1]


# -- RouterDC --------------------------------------------------------------------------------


def test_a_routerdc_file_is_priced_by_the_documented_table(tmp_path: Path) -> None:
    question = "x" * 41  # 11 estimated prompt tokens
    source = write_dc(tmp_path / "gsm8k-train.json", [dc_item(question), dc_item("Another?")])

    imported = import_outcomes("routerdc", [source])
    write_outcome_table(imported.rows, tmp_path / "t.jsonl")

    rows = read_outcome_table(tmp_path / "t.jsonl").rows
    assert rows == imported.rows
    first = rows[0]
    assert (first.id, first.domain, first.split) == ("gsm8k.train.0", "gsm8k", "train")
    assert rows[1].id == "gsm8k.train.1"
    expected_cost = (11 * 0.20 + 256 * 0.20) / 1_000_000
    assert first.outcomes[MISTRAL].score == 0.8
    assert first.outcomes[MISTRAL].cost_usd == pytest.approx(expected_cost)
    assert first.outcomes[LLAMA].cost_usd == pytest.approx(expected_cost)  # one price class
    recorded = first.outcomes[MISTRAL]
    assert (recorded.prompt_tokens, recorded.completion_tokens, recorded.response) == (
        None,
        None,
        None,
    )
    assert len(ROUTERDC_PRICES) == 7


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        ("MATH_prealgebra.json", None, ("math-prealgebra", None, "math-prealgebra.all.0")),
        ("MATH_prealgebra.json", "test", ("math-prealgebra", "test", "math-prealgebra.all.0")),
        ("arc_challenge_test.json", None, ("arc-challenge", "test", "arc-challenge.test.0")),
        ("gsm8k-train.json", "test", ("gsm8k", "test", "gsm8k.train.0")),
    ],
)
def test_routerdc_domain_split_and_id_come_from_the_file_name(
    tmp_path: Path, name: str, split: Any, expected: tuple[str, str | None, str]
) -> None:
    source = write_dc(tmp_path / name, [dc_item()])

    (row,) = import_outcomes("routerdc", [source], split=split).rows

    assert (row.domain, row.split, row.id) == expected


def test_a_price_file_overrides_and_extends_the_price_table(tmp_path: Path) -> None:
    prices_file = tmp_path / "prices.yaml"
    prices_file.write_text("new/model-9b: {input: 1.0, output: 3}\n", encoding="utf-8")
    source = write_dc(tmp_path / "q.json", [dc_item("abcd", **{"new/model-9b": 1, MISTRAL: 0})])

    (row,) = import_outcomes("routerdc", [source], prices=read_prices(prices_file)).rows

    assert row.outcomes["new/model-9b"].cost_usd == pytest.approx((1 * 1.0 + 256 * 3) / 1e6)
    assert row.outcomes[MISTRAL].cost_usd == pytest.approx((1 * 0.2 + 256 * 0.2) / 1e6)
    assert row.score("new/model-9b") == 1.0


# -- outcome tables --------------------------------------------------------------------------


def test_tables_are_merged_and_their_split_may_be_overridden(tmp_path: Path) -> None:
    first = tmp_path / "a.jsonl"
    first.write_text(table_line("a1") + "\n" + table_line("a2", score=None), encoding="utf-8")
    second = tmp_path / "b.jsonl"
    second.write_text(table_line("b1", score=0.5, split="train"), encoding="utf-8")

    merged = import_outcomes("table", [first, second]).rows
    as_test = import_outcomes("table", [first, second], split="test").rows

    assert [row.id for row in merged] == ["a1", "a2", "b1"]
    assert merged[1].score("w") is None
    assert [row.split for row in merged] == [None, None, "train"]
    assert {row.split for row in as_test} == {"test"}


# -- refused files ---------------------------------------------------------------------------


def _bench(tmp_path: Path, rows: list[dict[str, str]], header: list[str] = HEADER) -> Path:
    return write_bench(tmp_path / "rb_train.csv", rows, header)


BAD_FILES: dict[str, tuple[Callable[[Path], object], list[str]]] = {
    "a table line that is not JSON": (
        lambda d: import_outcomes(
            "table", [_text(d / "t.jsonl", table_line("a") + '{"id": "b",\n')]
        ),
        ["t.jsonl:2: not JSON"],
    ),
    "a table score out of range": (
        lambda d: import_outcomes("table", [_text(d / "t.jsonl", table_line("a", 1.5))]),
        ["t.jsonl:1: field outcomes.w.score", "less than or equal to 1"],
    ),
    "a table field unknown": (
        lambda d: import_outcomes("table", [_text(d / "t.jsonl", table_line("a", difficulty=3))]),
        ["t.jsonl:1: field difficulty: Extra inputs are not permitted"],
    ),
    "an id in two tables": (
        lambda d: import_outcomes(
            "table",
            [
                _text(d / "a.jsonl", table_line("x") + table_line("y")),
                _text(d / "b.jsonl", "\n" + table_line("y")),
            ],
        ),
        ["b.jsonl:2: field id: 'y' already on", "a.jsonl:2"],
    ),
    "a RouterDC score out of range": (
        lambda d: import_outcomes(
            "routerdc", [write_dc(d / "x.json", [dc_item(), dc_item(**{MISTRAL: 1.7})])]
        ),
        [f"x.json:3: item 1: field scores.{MISTRAL}: 1.7 is not between 0 and 1"],
    ),
    "a RouterDC score not a number": (
        lambda d: import_outcomes(
            "routerdc", [write_dc(d / "x.json", [dc_item(**{MISTRAL: True})])]
        ),
        [f"x.json:2: item 0: field scores.{MISTRAL}: True is not a number"],
    ),
    "a RouterDC field unknown": (
        lambda d: import_outcomes(
            "routerdc", [write_dc(d / "x.json", [{**dc_item(), "difficulty": 0.3}])]
        ),
        ["x.json:2: item 0: field difficulty: unknown"],
    ),
    "a RouterDC key missing": (
        lambda d: import_outcomes(
            "routerdc", [write_dc(d / "x.json", [dc_item(), {"question": "Q?"}])]
        ),
        ["x.json:3: item 1: field scores: missing"],
    ),
    "a RouterDC file that is not JSON": (
        lambda d: import_outcomes(
            "routerdc", [_text(d / "x.json", '[\n {"question": "Q",\n  "scores": {,}}\n]')]
        ),
        ["x.json:3: not JSON"],
    ),
    "a RouterDC model with no price": (
        lambda d: import_outcomes(
            "routerdc", [write_dc(d / "x.json", [dc_item(**{"acme/giant-70b": 0.5})])]
        ),
        ["x.json:2: item 0: field scores.acme/giant-70b: no price for model 'acme/giant-70b'"],
    ),
    "a RouterDC file imported twice": (
        lambda d: import_outcomes("routerdc", [write_dc(d / "x.json", [dc_item()]), d / "x.json"]),
        ["x.json: item 0: field id: 'x.all.0' already on", "x.json: item 0"],
    ),
    "a RouterBench cost that is not a number": (
        lambda d: import_outcomes(
            "routerbench",
            [_bench(d, [bench_row("a", ["Q"]), bench_row("b", ["R"], gpt__total_cost="abc")])],
        ),
        ["rb_train.csv:3: column gpt|total_cost: 'abc' is not a number"],
    ),
    "a RouterBench score that is not 0 or 1": (
        lambda d: import_outcomes("routerbench", [_bench(d, [bench_row("a", ["Q"], llama="0.5")])]),
        ["rb_train.csv:2: column llama: '0.5' is not 0 or 1"],
    ),
    "a RouterBench column missing": (
        lambda d: import_outcomes(
            "routerbench",
            [_bench(d, [bench_row("a", ["Q"])], [h for h in HEADER if h != "eval_name"])],
        ),
        ["rb_train.csv:1: missing column(s) eval_name"],
    ),
    "a RouterBench prompt that is not a list of strings": (
        lambda d: import_outcomes(
            "routerbench", [_bench(d, [bench_row("a", ["Q"], prompt="What?")])]
        ),
        ["rb_train.csv:2: column prompt: not a Python list of strings"],
    ),
    "a RouterBench id on two different questions": (
        lambda d: import_outcomes(
            "routerbench", [_bench(d, [bench_row("a", ["Q"]), bench_row("a", ["Other"])])]
        ),
        ["rb_train.csv:3: column sample_id: 'a' already on", "rb_train.csv:2 (a different"],
    ),
    "a RouterBench id scoring one model twice": (
        lambda d: import_outcomes(
            "routerbench",
            [_bench(d, [bench_row("a", ["Q"]), bench_row("a", ["Q"], gpt="0")])],
        ),
        ["rb_train.csv:3: column sample_id: 'a'", "both record worker 'gpt'"],
    ),
    "a price file with a negative price": (
        lambda d: read_prices(_text(d / "p.json", '{"m": {"input": -1, "output": 2}}')),
        ["p.json: field m.input: -1 is not a price"],
    ),
}


def _text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_a_bad_file_is_refused_naming_file_line_and_field(tmp_path: Path, case: str) -> None:
    action, needles = BAD_FILES[case]

    with pytest.raises(ConfigurationError) as refused:
        action(tmp_path)

    message = str(refused.value)
    assert str(tmp_path) in message
    for needle in needles:
        assert needle in message, message


# -- the command -----------------------------------------------------------------------------


def test_conductor_outcomes_import_writes_the_table_and_prints_the_summary(
    tmp_path: Path,
) -> None:
    source = write_bench(
        tmp_path / "arc_test.csv",
        [bench_row("a", ["Q1"]), bench_row("b", ["Q2"], gpt="0.0", llama="")],
    )
    out = tmp_path / "t.jsonl"

    done = run_conductor_here(
        "outcomes", "import", "--from", "routerbench", str(source), "--out", str(out)
    )

    assert done.returncode == 0, done.stderr
    assert [row.id for row in read_outcome_table(out)] == ["a", "b"]
    assert "2 rows written to" in done.stdout
    rows = {cells[0]: cells[1:] for cells in table_cells(done.stdout)}
    # questions, train, test, no split
    assert rows["arc-challenge"] == rows["all"] == ["2", "0", "2", "0"]
    # questions recorded, mean score, mean cost per 1,000 questions (USD)
    assert rows["gpt"] == ["2", "0.500", "5.200"]
    assert rows["llama"] == ["1", "0.000", "0.100"]


def test_conductor_outcomes_import_from_table_without_out_only_validates(
    tmp_path: Path,
) -> None:
    table = _text(tmp_path / "t.jsonl", table_line("a") + table_line("b", 0))

    done = run_conductor_here("outcomes", "import", "--from", "table", str(table))

    assert done.returncode == 0, done.stderr
    assert "2 rows valid; nothing written" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--from", "routerdc", "{dc}", "--out", "{out}"], "x.json:2: item 0: field scores."),
        (["--from", "routerbench", "{dc}"], "--out is needed"),
        (["--from", "csv", "{dc}", "--out", "{out}"], "--from 'csv': choose one of"),
        (["--from", "table", "{dc}", "--split", "dev"], "--split 'dev': choose train or test"),
        (["--from", "table", "{dc}", "--prices", "{dc}"], "--prices applies to --from routerdc"),
    ],
)
def test_bad_input_exits_2_with_the_message(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    from conductor_cli import main

    bad = write_dc(tmp_path / "x.json", [dc_item(**{MISTRAL: -0.1})])
    out = tmp_path / "t.jsonl"
    argv = [a.format(dc=bad, out=out) for a in args]
    monkeypatch.setattr(sys, "argv", ["conductor", "outcomes", "import", *argv])

    with pytest.raises(SystemExit) as exited:
        main()

    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert "conductor: error: " in stderr
    assert needle in stderr, stderr
    assert not out.exists()
