"""The routing-aware warm-up: labels from outcome tables and routers, training questions only,
target plans on the labelled worker with a subtask per kind of question, and
``conductor train --warmup-labels`` end to end on a replay pool.

Every table here is written by the test itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conductor.errors import ConfigurationError
from conductor.ports import PromptForm
from conductor.protocol import parse_plan, validate_plan
from conductor.protocol.examples import copies_an_example
from conductor_evaluation import EvalItem, is_held_out, load_suite
from conductor_evaluation.replay import replay_pool
from conductor_trainer.routing_warmup import (
    CHOICE_SUBTASK,
    CODE_SUBTASK,
    GENERAL_SUBTASK,
    MATH_SUBTASK,
    LabelSource,
    label_shares,
    routing_examples,
    routing_labels,
    subtask_for,
)

from fakes.cli import run_conductor, run_conductor_here


def outcome(score: float, cost: float) -> dict[str, Any]:
    return {"score": score, "cost_usd": cost}


def write_table(path: Path) -> Path:
    """Math questions that only the dear "Big" model gets right, code questions both get right
    (the cheap "Small" one at a tenth of the price), and test-split questions where "Small" alone
    is right (which must never reach a label)."""
    rows = []
    for i in range(6):
        rows.append(
            {
                "id": f"m{i}",
                "question": f"What is {i} + {i * 3}?",
                "domain": "gsm8k",
                "split": "train",
                "outcomes": {"acme/Big": outcome(1, 0.010), "acme/Small": outcome(0, 0.001)},
            }
        )
        rows.append(
            {
                "id": f"c{i}",
                "question": f"Write a function that returns {i} squared.",
                "domain": "mbpp",
                "split": "train",
                "outcomes": {"acme/Big": outcome(1, 0.010), "acme/Small": outcome(1, 0.001)},
            }
        )
        rows.append(
            {
                "id": f"t{i}",
                "question": f"Which is larger, {i} or {i + 1}? (A) {i} (B) {i + 1}",
                "domain": "arc-challenge",
                "split": "test",
                "outcomes": {"acme/Big": outcome(0, 0.010), "acme/Small": outcome(1, 0.001)},
            }
        )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return write_table(tmp_path / "table.jsonl")


def items_of(table: Path) -> list[EvalItem]:
    return load_suite(f"table:{table}")


def test_outcome_labels_take_the_best_single_call_under_the_cost_aware_reward(table: Path) -> None:
    items = items_of(table)
    by_id = {item.id: item.key for item in items}
    # At weight 0 the best score wins, and a tie goes to the cheaper worker.
    labels = routing_labels(LabelSource.parse(f"outcomes:{table}"), items, ["big", "small"])
    assert {labels[by_id[f"m{i}"]] for i in range(6)} == {"big"}
    assert {labels[by_id[f"c{i}"]] for i in range(6)} == {"small"}
    # Held-out (test-split) questions are never labelled, whatever their outcomes say.
    assert all(not is_held_out(item) for item in items if item.key in labels)
    assert len(labels) == 12
    assert label_shares(labels) == {"big": 0.5, "small": 0.5}
    # At a weight where the dear worker's call costs more than its right answer earns
    # (0.5 + 0.5 - 0.6 x 1 < 0.5 + 0 - 0.6 x 0.1), the cheap one gets the math too.
    cheap = routing_labels(LabelSource.parse(f"outcomes:{table}:0.6"), items, ["big", "small"])
    assert set(cheap.values()) == {"small"}
    # Only the pool's workers are labels.
    assert set(routing_labels(LabelSource.parse(f"outcomes:{table}"), items, ["big"]).values()) == {
        "big"
    }


def test_a_router_labels_training_questions_with_its_choice(table: Path, tmp_path: Path) -> None:
    from conductor_router import save_router_model
    from conductor_trainer.routing_data import table_routing_data, train_router

    from fakes.embedder import HashEmbedder

    models, _ = train_router(table_routing_data(table), HashEmbedder())
    router_file = tmp_path / "router.json"
    save_router_model(models["router"], router_file)
    items = items_of(table)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("conductor_router.QuestionEmbedder", HashEmbedder)
        labels = routing_labels(
            LabelSource.parse(f"router:{router_file}:0"), items, ["big", "small"]
        )
    assert len(labels) == 12
    assert set(labels.values()) <= {"big", "small"}
    assert all(not is_held_out(item) for item in items if item.key in labels)


def test_target_plans_route_to_the_label_as_each_prompt_numbers_its_pool(table: Path) -> None:
    items = items_of(table)
    by_key = {item.key: item for item in items}
    math_key = next(item.key for item in items if item.id == "m0")
    code_key = next(item.key for item in items if item.id == "c0")
    rows = [
        {"prompt": "P1", "item_key": math_key, "pool_names": ["small", "big"]},
        {"prompt": "P2", "item_key": code_key, "pool_names": ["small", "big"]},
        {"prompt": "P3", "item_key": math_key, "pool_names": ["small"]},  # its label not shown
    ]
    targets = routing_examples(rows, by_key, {math_key: "big", code_key: "small"}, PromptForm.FULL)
    assert [t["prompt"] for t in targets] == ["P1", "P2"]
    plans = []
    for target in targets:
        parsed = parse_plan(target["completion"])
        checked = validate_plan(parsed, pool_size=2, max_steps=5, examples_shown=True)  # type: ignore[arg-type]
        assert checked.valid, checked.errors
        assert checked.plan is not None
        plans.append(checked.plan)
    assert [p.steps[0].model_id for p in plans] == [1, 0]
    assert [p.steps[0].subtask for p in plans] == [MATH_SUBTASK, CODE_SUBTASK]
    with pytest.raises(ConfigurationError, match="labels none of the training questions"):
        routing_examples(rows[2:], by_key, {math_key: "big"}, PromptForm.FULL)


def test_each_kind_of_question_gets_its_subtask_and_none_is_an_examples(table: Path) -> None:
    suites = {
        "gsm8k": MATH_SUBTASK,
        "arc-challenge": CHOICE_SUBTASK,
        "mbpp": CODE_SUBTASK,
    }
    for suite, subtask in suites.items():
        item = load_suite(suite, limit=1, seed=0)[0]
        assert subtask_for(item) == subtask, suite
    by_domain = {item.metadata["domain"]: subtask_for(item) for item in items_of(table)}
    assert by_domain == {
        "gsm8k": MATH_SUBTASK,
        "mbpp": CODE_SUBTASK,
        "arc-challenge": CHOICE_SUBTASK,
    }
    for subtask in (MATH_SUBTASK, CHOICE_SUBTASK, CODE_SUBTASK, GENERAL_SUBTASK):
        assert not copies_an_example(subtask)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("labels.jsonl", "use outcomes:PATH"),
        ("oracle:x", "use outcomes:PATH"),
        ("outcomes:", "use outcomes:PATH"),
        ("outcomes:{table}:-1", "must be a number >= 0"),
        ("outcomes:{table}:nan", "must be a number >= 0"),
        ("router:/nowhere/router.json", "does not exist"),
    ],
)
def test_a_bad_label_source_is_refused_with_the_form_to_use(
    spec: str, needle: str, table: Path
) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        LabelSource.parse(spec.format(table=table))


def test_a_table_of_other_workers_is_refused_naming_both(table: Path) -> None:
    with pytest.raises(ConfigurationError, match="records none of the pool's workers"):
        routing_labels(LabelSource.parse(f"outcomes:{table}"), items_of(table), ["other"])


@pytest.mark.processes
def test_warmup_labels_need_warmup_steps(table: Path, tmp_path: Path) -> None:
    done = run_conductor(
        "train",
        *("--pool", f"replay:{table}", "--suite", f"table:{table}"),
        *("--warmup-labels", f"outcomes:{table}", "--out", str(tmp_path / "out")),
    )
    assert done.returncode == 2
    assert "--warmup-labels needs warm-up steps: --format-warmup N" in done.stderr


@pytest.mark.training
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' renames, inside TRL
def test_conductor_train_warms_up_on_routing_targets_and_records_the_prior(
    table: Path, tmp_path: Path
) -> None:
    from fakes.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    done = run_conductor_here(
        "train",
        *("--base-model", str(tiny), "--pool", f"replay:{table}", "--suite", f"table:{table}"),
        *("--format-warmup", "2", "--warmup-labels", f"outcomes:{table}"),
        *("--steps", "1", "--questions-per-step", "1", "--group-size", "2"),
        *("--max-tokens", "16", "--items", "20", "--save-every", "0", "--out", str(out)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = json.loads((out / "warmup_labels.json").read_text())
    assert recorded["labelled_questions"] == 12
    assert recorded["shares"] == {"big": 0.5, "small": 0.5}
    assert (out / "warmup-checkpoint" / "config.json").exists()
    assert (out / "checkpoint" / "config.json").exists()
    assert len(replay_pool(table).workers) == 2
