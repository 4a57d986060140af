"""The Conductor protocol: prompt rendering, tolerant parsing, strict validation, schema."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.ports import PlanFormat, PlanRequest, PriorRound, PromptForm
from conductor.protocol import (
    ParsedLists,
    ParseFailure,
    fallback_plan,
    parse_plan,
    plan_schema,
    render_output,
    render_prompt,
    text_limits,
    validate_plan,
)
from conductor.protocol.examples import EXAMPLES
from conductor.protocol.schema import MAX_REASONING_CHARS
from conductor.workflow import ALL, Plan, PlanStep, PoolEntry

POOL = [
    PoolEntry(name="math", description="Strong at math."),
    PoolEntry(name="fast", description="Fast and cheap."),
    PoolEntry(name="coder", description="Writes code."),
]


def _plan(*steps: tuple[int, str, tuple[Any, ...]]) -> Plan:
    return Plan(steps=tuple(PlanStep(model_id=m, subtask=s, access_list=a) for m, s, a in steps))


# --- prompt ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(PlanFormat))
def test_prompt_numbers_the_pool_shows_four_examples_and_the_question(fmt: PlanFormat) -> None:
    request = PlanRequest(question="What is 6 * 7?", pool=POOL, max_steps=5)

    system, user = render_prompt(request, fmt)

    assert system.role == "system"
    assert user.role == "user"
    assert "Model 0: Strong at math." in user.content
    assert "Model 2: Writes code." in user.content
    assert user.content.rstrip().endswith("Question: What is 6 * 7?")
    assert [f"Example {i}" in system.content for i in range(1, 5)] == [True] * 4
    assert "Example 5" not in system.content
    # Worker names are withheld from the Conductor.
    assert "coder" not in user.content


def test_prompt_for_one_step_variant_only_shows_one_step_examples() -> None:
    request = PlanRequest(question="q", pool=POOL, max_steps=1)
    system, _ = render_prompt(request, PlanFormat.LISTS)
    for example in EXAMPLES:
        assert example.routing_plan.as_lists_text() in system.content
        if len(example.plan.steps) > 1:
            assert example.plan.as_lists_text() not in system.content


@pytest.mark.parametrize("fmt", list(PlanFormat))
def test_a_prompt_without_examples_keeps_the_task_output_form_pool_and_question(
    fmt: PlanFormat,
) -> None:
    request = PlanRequest(question="What is 6 * 7?", pool=POOL, max_steps=5)
    with_examples = render_prompt(request, fmt)
    system, user = render_prompt(request, fmt, form=PromptForm.SHORT)
    assert "Example" not in system.content
    assert "sample team" not in system.content
    assert system.content in with_examples[0].content  # the same text, less the examples
    assert len(system.content) < len(with_examples[0].content) / 2
    assert user == with_examples[1]


@pytest.mark.parametrize("fmt", list(PlanFormat))
@pytest.mark.parametrize("offer_conductor", [False, True])
def test_the_compact_prompt_says_the_rules_in_brief(fmt: PlanFormat, offer_conductor: bool) -> None:
    pool = [*POOL, PoolEntry(name="conductor", description="", is_conductor=True)]
    request = PlanRequest(
        question="What is 6 * 7?", pool=pool if offer_conductor else POOL, max_steps=4
    )
    short = render_prompt(request, fmt, form=PromptForm.SHORT)
    system, user = render_prompt(request, fmt, form=PromptForm.COMPACT)
    assert "Example" not in system.content
    # Every rule a plan is judged by is still named: the step limit, the three fields, the
    # access list's forms, who sees the question, and what the last step is for.
    for rule in ("1 to 4 steps", "model_id", "subtask", "access_list", '["all"]', "first", "last"):
        assert rule in system.content, rule
    assert "steps" in system.content
    assert ("JSON" in system.content) is (fmt is PlanFormat.JSON)
    assert len(system.content) < len(short[0].content) / 2
    assert user.content.endswith("Question: What is 6 * 7?")
    for model_id, entry in enumerate(POOL):
        assert f"Model {model_id}: {entry.description}" in user.content
    if offer_conductor:
        assert f"Model {len(POOL)}: you; only as the last step" in user.content
    assert len(user.content) <= len(short[1].content)


def test_the_compact_prompt_shows_a_long_question_s_head_and_tail() -> None:
    document = "".join(f"Line {i} of a long document.\n" for i in range(400))
    question = f"Read this.\n{document}Which line comes after line 398?"
    request = PlanRequest(question=question, pool=POOL, max_steps=5)
    _, full_user = render_prompt(request, PlanFormat.LISTS, form=PromptForm.SHORT)
    _, user = render_prompt(request, PlanFormat.LISTS, form=PromptForm.COMPACT)
    assert question in full_user.content  # the forms trained before see the question whole
    shown = user.content.split("Question: ", 1)[1]
    assert shown.startswith("Read this.\nLine 0 of a long document.")
    assert shown.endswith("Line 399 of a long document.\nWhich line comes after line 398?")
    assert "characters ...]" in shown
    assert len(shown) < 1100 < len(question)
    short_question = PlanRequest(question="What is 6 * 7?", pool=POOL, max_steps=5)
    _, user = render_prompt(short_question, PlanFormat.LISTS, form=PromptForm.COMPACT)
    assert user.content.endswith("Question: What is 6 * 7?")


@pytest.mark.parametrize("fmt", list(PlanFormat))
@pytest.mark.parametrize("offer_conductor", [False, True])
def test_the_minimal_prompt_names_the_workers_and_asks_for_the_plan_alone(
    fmt: PlanFormat, offer_conductor: bool
) -> None:
    pool = [*POOL, PoolEntry(name="conductor", description="", is_conductor=True)]
    request = PlanRequest(
        question="What is 6 * 7?", pool=pool if offer_conductor else POOL, max_steps=4
    )
    compact = render_prompt(request, fmt, form=PromptForm.COMPACT)
    system, user = render_prompt(request, fmt, form=PromptForm.MINIMAL)
    assert "1 to 4 steps" in system.content
    for field in ("model_id", "subtask", "access_list"):
        assert field in system.content, field
    assert "reasoning" not in system.content
    assert ("JSON" in system.content) is (fmt is PlanFormat.JSON)
    assert len(system.content) < len(compact[0].content) / 2
    for model_id, entry in enumerate(POOL):
        assert f"\n{model_id}: {entry.name}\n" in user.content + "\n"
        assert entry.description not in user.content
    if offer_conductor:
        assert f"\n{len(POOL)}: you; only as the last step" in user.content
    assert user.content.endswith("Question: What is 6 * 7?")
    assert len(user.content) < len(compact[1].content)


def test_the_minimal_prompt_keeps_less_of_a_long_question_than_the_compact_one() -> None:
    document = "".join(f"Line {i} of a long document.\n" for i in range(400))
    question = f"Read this.\n{document}Which line comes after line 398?"
    request = PlanRequest(question=question, pool=POOL, max_steps=5)
    shown = {
        form: render_prompt(request, PlanFormat.LISTS, form=form)[1].content.split("Question: ")[1]
        for form in (PromptForm.COMPACT, PromptForm.MINIMAL)
    }
    minimal = shown[PromptForm.MINIMAL]
    assert minimal.startswith("Read this.\nLine 0 of a long document.")
    assert minimal.endswith("Which line comes after line 398?")
    assert len(minimal) < 500 < len(shown[PromptForm.COMPACT])


def test_examples_are_valid_plans_in_both_formats() -> None:
    for example in EXAMPLES:
        for plan in (example.plan, example.routing_plan):
            for fmt in PlanFormat:
                parsed = parse_plan(render_output(plan, example.reasoning, fmt))
                assert isinstance(parsed, ParsedLists)
                assert validate_plan(parsed, pool_size=3, max_steps=5).plan == plan


def test_prompt_offers_the_conductor_and_shows_the_previous_round() -> None:
    pool = [*POOL, PoolEntry(name="conductor", description="", is_conductor=True)]
    prior = PriorRound(
        plan=_plan((0, "Solve it.", ()), (3, "Review.", (ALL,))),
        answers=["41", None],
        last_answer="41",
    )
    request = PlanRequest(question="q", pool=pool, max_steps=2, round=1, prior=prior)

    _, user = render_prompt(request, PlanFormat.LISTS)

    assert "Model 3: the Conductor (you)" in user.content
    assert "Step 0 (Model 0): 41" in user.content
    # The last answer is step 0's: named, not repeated.
    assert "Last answer: the answer of step 0 above." in user.content
    assert user.content.count("41") == 1
    assert "model_id = [], subtasks = [], access_list = []" in user.content


def test_a_last_answer_no_step_gave_is_shown_in_full() -> None:
    prior = PriorRound(plan=_plan((0, "Solve it.", ())), answers=[None], last_answer="41")
    request = PlanRequest(question="q", pool=POOL, max_steps=1, round=1, prior=prior)

    _, user = render_prompt(request, PlanFormat.LISTS)

    assert "Last answer: 41" in user.content


def test_every_round_of_a_workflow_shares_one_system_prompt() -> None:
    # given: the first round of a 5-step workflow, and a later round allowed 2 steps
    first = PlanRequest(question="q", pool=POOL, max_steps=5, workflow_max_steps=5)
    prior = PriorRound(plan=_plan((0, "Solve it.", ())), answers=["41"], last_answer="41")
    later = PlanRequest(
        question="q", pool=POOL, max_steps=2, workflow_max_steps=5, round=1, prior=prior
    )

    system_first, user_first = render_prompt(first, PlanFormat.JSON)
    system_later, user_later = render_prompt(later, PlanFormat.JSON)

    # then: one system prompt (a model server caches it once); the later round's limit is in
    # its user message, and a round at the workflow's limit says nothing more
    assert system_first == system_later
    assert (
        system_first
        == render_prompt(PlanRequest(question="q", pool=POOL, max_steps=5), PlanFormat.JSON)[0]
    )
    assert user_later.content.endswith("Write at most 2 steps.")
    assert "Write at most" not in user_first.content


# --- parser ---------------------------------------------------------------------------------


def test_parses_the_three_lists_with_reasoning_around_them() -> None:
    text = """Let me think. Model 2 codes well, so it goes last.
    model_id = [0, 2]
    subtasks = ["Design it, using [brackets] and 'quotes'.", "Implement the design."]
    access_list = [[], ["all"]]
    That is my plan."""
    parsed = parse_plan(text)
    assert parsed == ParsedLists(
        [0, 2],
        ["Design it, using [brackets] and 'quotes'.", "Implement the design."],
        [[], ["all"]],
        form="lists",
    )


def test_the_last_occurrence_of_each_list_wins() -> None:
    text = "Draft: model_id = [1]\nFinal:\nmodel_id = [2]\nsubtasks = ['x']\naccess_list = [[]]"
    parsed = parse_plan(text)
    assert isinstance(parsed, ParsedLists)
    assert parsed.model_id == [2]


def test_parses_lists_inside_a_code_fence() -> None:
    text = "```python\nmodel_id = [1]\nsubtasks = ['Answer.']\naccess_list = [[]]\n```"
    assert isinstance(parse_plan(text), ParsedLists)


def test_parses_the_json_forms() -> None:
    three = '{"model_id": [1], "subtasks": ["Answer."], "access_list": [[]]}'
    steps = (
        'Sure! {"reasoning": "r", "steps": [{"model_id": 1, "subtask": "A", "access_list": []}]}'
    )
    assert parse_plan(three) == ParsedLists([1], ["Answer."], [[]], form="json")
    assert parse_plan(steps) == ParsedLists([1], ["A"], [[]], form="json-steps")


@pytest.mark.parametrize(
    "text",
    ["", "no plan here", "model_id = [1", "model_id = [1]\nsubtasks = ['a']", "{not json}", "[]"],
)
def test_text_without_a_plan_is_a_parse_failure(text: str) -> None:
    assert isinstance(parse_plan(text), ParseFailure)


@settings(max_examples=300)
@given(st.text())
def test_parser_never_raises_on_arbitrary_text(text: str) -> None:
    assert isinstance(parse_plan(text), ParsedLists | ParseFailure)


_fragments = st.sampled_from(
    [
        "model_id = [",
        "subtasks = [",
        "access_list = [",
        "]",
        "[",
        "{",
        "}",
        '"',
        "'",
        "\\",
        '"all"',
        ", ",
        "0",
        "-1",
        "1e999",
        '{"steps": [',
        '{"model_id": 0, "subtask": "x", "access_list": []}',
        "(",
        ")",
        "None",
        "```",
        "\n",
    ]
)


@settings(max_examples=500)
@given(st.lists(st.one_of(_fragments, st.text(max_size=5)), max_size=40).map("".join))
def test_parser_never_raises_on_plan_like_text(text: str) -> None:
    result = parse_plan(text)
    if isinstance(result, ParsedLists):
        # Whatever it extracted, validation decides without raising either.
        validate_plan(result, pool_size=3, max_steps=5, conductor_id=2, allow_stop=True)


def test_parser_handles_deep_nesting_and_huge_input() -> None:
    deep = "model_id = " + "[" * 5000 + "]" * 5000 + "\nsubtasks = []\naccess_list = []"
    assert isinstance(parse_plan(deep), ParsedLists | ParseFailure)
    assert isinstance(parse_plan("[" * 200_000), ParseFailure)


# --- validator ------------------------------------------------------------------------------


def _validate(ids: list[Any], subtasks: list[Any], access: list[Any], **kw: Any) -> list[str]:
    kw.setdefault("pool_size", 3)
    kw.setdefault("max_steps", 5)
    return validate_plan(ParsedLists(ids, subtasks, access, form="lists"), **kw).errors


def test_a_valid_plan_normalises_access_lists() -> None:
    result = validate_plan(
        ParsedLists([0, 1, 2], ["a", "b", "c"], [[], [0, 0], [1, 0]], form="lists"),
        pool_size=3,
        max_steps=5,
    )
    assert result.valid
    assert result.plan is not None
    assert [s.access_list for s in result.plan.steps] == [(), (0,), (0, 1)]


@pytest.mark.parametrize(
    ("ids", "subtasks", "access", "kw", "needle"),
    [
        ([0, 1], ["a"], [[], []], {}, "differ in length"),
        ([], [], [], {}, "no steps"),
        ([0] * 6, ["a"] * 6, [[]] * 6, {}, "at most 5"),
        ([0, 0], ["a", "b"], [[], []], {"max_steps": 1}, "at most 1"),
        ([3], ["a"], [[]], {}, "not in the pool"),
        ([-1], ["a"], [[]], {}, "not in the pool"),
        (["0"], ["a"], [[]], {}, "not an integer"),
        ([True], ["a"], [[]], {}, "not an integer"),
        ([0], [""], [[]], {}, "non-empty"),
        ([0], [None], [[]], {}, "non-empty"),
        ([0, 1], ["a", "b"], [[], [1]], {}, "not an earlier step"),
        ([0, 1], ["a", "b"], [[], [2]], {}, "not an earlier step"),
        ([0], ["a"], [[0]], {}, "not an earlier step"),
        ([0, 1], ["a", "b"], [[], ["some"]], {}, "not a step number"),
        ([0, 1], ["a", "b"], [[], "all"], {}, "not a list"),
        ([0, 1], ["a", "b"], [[], ["all", 5]], {}, "mixes 'all'"),
        ([2, 0], ["a", "b"], [[], []], {"conductor_id": 2}, "only be the last step"),
        ([2], ["a"], [[]], {"conductor_id": 2}, "only be the last step"),
    ],
)
def test_invalid_plans_are_rejected_with_a_reason(
    ids: list[Any], subtasks: list[Any], access: list[Any], kw: dict[str, Any], needle: str
) -> None:
    errors = _validate(ids, subtasks, access, **kw)
    assert errors
    assert any(needle in e for e in errors), errors


def test_empty_lists_stop_only_a_recursion_round() -> None:
    stop = validate_plan(
        ParsedLists([], [], [], form="lists"), pool_size=3, max_steps=2, allow_stop=True
    )
    assert stop.valid
    assert stop.stop
    assert stop.plan is None


def test_the_conductor_may_be_the_last_step() -> None:
    assert _validate([0, 2], ["a", "review"], [[], ["all"]], conductor_id=2) == []


def test_a_subtask_copied_from_the_examples_is_refused_where_they_were_shown() -> None:
    copied = EXAMPLES[2].plan.steps[0].subtask  # "Answer with the letter of ... only."
    for variant in (copied, "  " + copied.upper().rstrip(".") + "  ", copied.replace(" ", "\n")):
        shown = validate_plan(
            ParsedLists([0], [variant], [[]], form="lists"),
            pool_size=2,
            max_steps=3,
            examples_shown=True,
        )
        assert not shown.valid
        assert "copied from the prompt's examples" in shown.errors[0]
    # Without the examples in its prompt a model cannot have copied them.
    assert validate_plan(
        ParsedLists([0], [copied], [[]], form="lists"), pool_size=2, max_steps=3
    ).valid
    # Every example subtask, of both plan forms, counts; a subtask merely like one does not.
    for example in EXAMPLES:
        for step in (*example.plan.steps, *example.routing_plan.steps):
            assert _validate([0], [step.subtask], [[]], examples_shown=True)
    assert _validate([0], [copied + " Then explain why."], [[]], examples_shown=True) == []
    # A near copy (the README's pens question once got this, one letter off an example's).
    near = "Analyse the first option the question name: its costs and strengths."
    assert _validate([0], [near], [[]], examples_shown=True)


def test_fallback_is_one_step_on_the_given_worker() -> None:
    assert fallback_plan(1).steps == (PlanStep(model_id=1, subtask="Answer the question."),)


# --- schema ---------------------------------------------------------------------------------


def _schema_accepts(schema: dict[str, Any], steps: list[dict[str, Any]]) -> bool:
    try:
        jsonschema.validate({"reasoning": "r", "steps": steps}, schema)
    except jsonschema.ValidationError:
        return False
    return True


@functools.cache
def _plan_validator(with_conductor: bool, allow_stop: bool) -> Any:
    """The plan schema's validator, built once: building one per example (what
    ``jsonschema.validate`` does) cost most of this property test's time."""
    schema = plan_schema(
        worker_ids=[0, 1, 2],
        max_steps=4,
        conductor_id=3 if with_conductor else None,
        allow_stop=allow_stop,
    )
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


@st.composite
def _near_valid_steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Mostly valid steps with occasional off-by-one ids, empty subtasks and forward access."""
    steps = []
    for index in range(draw(st.integers(0, 5))):
        access = draw(
            st.one_of(
                st.just(["all"]),
                st.lists(st.integers(-1, index), max_size=2, unique=True),
                st.lists(st.integers(0, max(index - 1, 0)), max_size=2, unique=True),
                st.lists(st.one_of(st.integers(0, 5), st.just("all")), max_size=2),
            )
        )
        steps.append(
            {
                "model_id": draw(st.sampled_from([0, 1, 2, 3, 0, 1, 2, 0, 1, 2, -1, 4])),
                "subtask": draw(st.sampled_from(["do it", "check it", "go", "do it", "", "  "])),
                "access_list": access,
            }
        )
    return steps


@settings(max_examples=600)
@given(_near_valid_steps(), st.booleans(), st.booleans())
def test_every_plan_the_schema_admits_is_valid(
    steps: list[dict[str, Any]], with_conductor: bool, allow_stop: bool
) -> None:
    conductor_id = 3 if with_conductor else None
    validator = _plan_validator(with_conductor, allow_stop)
    if validator.is_valid({"reasoning": "r", "steps": steps}):
        parsed = parse_plan(json.dumps({"reasoning": "r", "steps": steps}))
        assert isinstance(parsed, ParsedLists)
        result = validate_plan(
            parsed,
            pool_size=4 if with_conductor else 3,
            max_steps=4,
            conductor_id=conductor_id,
            allow_stop=allow_stop,
        )
        assert result.valid, (steps, result.errors)


def test_schema_admits_parallel_steps_and_a_final_conductor() -> None:
    schema = plan_schema(worker_ids=[0, 1], max_steps=3, conductor_id=2)
    fan_in = [
        {"model_id": 0, "subtask": "a", "access_list": []},
        {"model_id": 1, "subtask": "b", "access_list": []},
        {"model_id": 0, "subtask": "c", "access_list": [0, 1]},
    ]
    review = [
        {"model_id": 0, "subtask": "a", "access_list": []},
        {"model_id": 2, "subtask": "review", "access_list": ["all"]},
    ]
    assert _schema_accepts(schema, fan_in)
    assert _schema_accepts(schema, review)
    assert not _schema_accepts(schema, [review[1]])
    assert not _schema_accepts(schema, [review[1], review[0]])


def test_schema_refuses_blank_subtasks() -> None:
    schema = plan_schema(worker_ids=[0], max_steps=2)
    assert not _schema_accepts(schema, [{"model_id": 0, "subtask": "   ", "access_list": []}])
    assert _schema_accepts(schema, [{"model_id": 0, "subtask": "Do it.\n", "access_list": []}])


def test_only_a_recursion_round_lets_its_first_step_see_everything_earlier() -> None:
    first_step = [{"model_id": 0, "subtask": "Check the answer.", "access_list": ["all"]}]
    round_zero = plan_schema(worker_ids=[0], max_steps=2)
    later_round = plan_schema(worker_ids=[0], max_steps=2, allow_stop=True)
    assert not _schema_accepts(round_zero, first_step)
    assert _schema_accepts(later_round, first_step)
    assert _schema_accepts(later_round, [])


def test_a_broken_json_object_does_not_hide_a_later_plan() -> None:
    plan = '{"steps": [{"model_id": 0, "subtask": "a", "access_list": []}]}'
    for junk in ('{"n": 1' + "0" * 5000 + "}", "{" * 3000 + "}" * 3000):
        assert parse_plan(f"{junk} then {plan}") == ParsedLists([0], ["a"], [[]], "json-steps")


@pytest.mark.timeout(30)
def test_repetitive_output_is_parsed_in_bounded_work() -> None:
    # Without a bound on the occurrences tried, this input takes minutes (quadratic scan).
    result = parse_plan(
        "model_id = [" * 8000 + "\nmodel_id = [1]\nsubtasks = ['a']\naccess_list = [[]]"
    )
    assert result == ParsedLists([1], ["a"], [[]], "lists")


@pytest.mark.parametrize(("max_tokens", "max_steps"), [(256, 1), (1024, 5), (2048, 5), (8192, 3)])
def test_the_longest_plan_the_schema_admits_fits_in_max_tokens(
    max_tokens: int, max_steps: int
) -> None:
    # Given the text limits for a token budget (a token spans at least one character)
    reasoning, subtask = text_limits(max_tokens, max_steps)
    schema = plan_schema(
        worker_ids=[0, 1],
        max_steps=max_steps,
        max_subtask_chars=subtask,
        max_reasoning_chars=reasoning,
    )
    # When a plan fills every text to its limit, with the widest access lists
    plan = {
        "reasoning": "r" * reasoning,
        "steps": [
            {"model_id": 1, "subtask": "s" * subtask, "access_list": list(range(i))}
            for i in range(max_steps)
        ],
    }
    jsonschema.validate(plan, schema)
    # Then its JSON still fits in the budget, counted one token per character
    assert len(json.dumps(plan, separators=(",", ":"))) <= max_tokens


@pytest.mark.parametrize(("max_tokens", "max_steps"), [(160, 1), (1024, 5)])
def test_a_plan_without_reasoning_has_no_reasoning_field_and_fits_in_max_tokens(
    max_tokens: int, max_steps: int
) -> None:
    reasoning, subtask = text_limits(max_tokens, max_steps, reasoning=False)
    assert reasoning == 0
    assert subtask > text_limits(max_tokens, max_steps)[1]  # the subtasks get the room
    schema = plan_schema(
        worker_ids=[0, 1], max_steps=max_steps, max_subtask_chars=subtask, max_reasoning_chars=0
    )
    assert schema["required"] == ["steps"]
    steps = [
        {"model_id": 1, "subtask": "s" * subtask, "access_list": list(range(i))}
        for i in range(max_steps)
    ]
    jsonschema.validate({"steps": steps}, schema)
    assert len(json.dumps({"steps": steps}, separators=(",", ":"))) <= max_tokens
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"reasoning": "r", "steps": steps}, schema)


@pytest.mark.parametrize("max_tokens", [2048, 8192])
def test_the_reasoning_stays_short_whatever_the_budget(max_tokens: int) -> None:
    # A large budget (conductor-ultra has 2048) raises the subtask limit, never the reasoning's,
    # which still leaves room for the longest example's reasoning and as much again, nearly
    reasoning, _ = text_limits(max_tokens, 5)
    longest_example = max(len(example.reasoning) for example in EXAMPLES)
    assert reasoning == MAX_REASONING_CHARS >= 1.9 * longest_example
    assert plan_schema(worker_ids=[0], max_steps=1)["properties"]["reasoning"] == {
        "type": "string",
        "maxLength": MAX_REASONING_CHARS,
    }
