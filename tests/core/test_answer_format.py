"""The answer's required form: what counts as the JSON asked for, and what does not."""

from __future__ import annotations

import json

import pytest

from conductor.answer_format import AnswerFormat, AnswerFormatError
from conductor.errors import InvalidRequest

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
OBJECT = AnswerFormat(type="json_object")
SCHEMA_FORMAT = AnswerFormat(type="json_schema", name="result", json_schema=SCHEMA)


@pytest.mark.parametrize(
    "answer",
    [
        '{"answer": 42}',
        '  {"answer": 42}\n',
        'Sure! Here it is:\n```json\n{"answer": 42}\n```\nAnything else?',
        '```\n{"answer": 42}\n```',
        'The result is {"answer": 42}.',
    ],
    ids=["bare", "spaces", "fenced-json", "fenced", "in-prose"],
)
def test_the_json_is_taken_out_of_what_the_model_wrapped_it_in(answer: str) -> None:
    assert SCHEMA_FORMAT.conform(answer) == '{"answer":42}'
    assert OBJECT.conform(answer) == '{"answer":42}'


@pytest.mark.parametrize(
    ("form", "answer", "reason"),
    [
        (OBJECT, "forty-two", "not JSON"),
        (OBJECT, "[1, 2]", "not an object"),
        (SCHEMA_FORMAT, '{"answer": "42"}', "at answer: '42' is not of type 'integer'"),
        (SCHEMA_FORMAT, '{"answer": 42, "extra": 1}', "Additional properties"),
        (SCHEMA_FORMAT, "{}", "'answer' is a required property"),
    ],
    ids=["prose", "array", "wrong-type", "extra-field", "missing-field"],
)
def test_an_answer_that_is_not_the_json_asked_for_says_why(
    form: AnswerFormat, answer: str, reason: str
) -> None:
    with pytest.raises(AnswerFormatError, match=reason):
        form.conform(answer)


def test_the_instruction_names_the_schema_in_a_stable_order() -> None:
    told = SCHEMA_FORMAT.instruction()
    assert "single JSON object" in told
    assert json.dumps(SCHEMA, sort_keys=True) in told
    assert "Schema" not in OBJECT.instruction()


def test_a_schema_that_is_not_one_is_refused_naming_the_field() -> None:
    broken = AnswerFormat(type="json_schema", json_schema={"type": "objekt"})
    with pytest.raises(InvalidRequest, match="not a valid JSON Schema") as refused:
        broken.check_schema("response_format")
    assert refused.value.param == "response_format"


def test_a_json_schema_format_needs_its_schema() -> None:
    with pytest.raises(ValueError, match="json_schema is required"):
        AnswerFormat(type="json_schema")


def test_a_json_object_answer_is_told_the_clients_instructions_and_a_schema_is_not() -> None:
    said = "Answer with the keys city and degrees."
    told = AnswerFormat(type="json_object", instructions=said).instruction()
    schema = {"type": "object"}
    with_schema = AnswerFormat(type="json_schema", json_schema=schema, instructions=said)

    assert told.endswith(f"What it must hold is in the client's instructions:\n{said}")
    assert said not in with_schema.instruction()
    assert said not in AnswerFormat(type="json_object").instruction()
