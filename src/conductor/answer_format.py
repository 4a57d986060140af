"""The form a client requires of a workflow's answer: one JSON object, or one that matches a JSON
Schema (OpenAI's ``response_format``).

The step that writes a round's answer (its plan's last step) is told the form; the answer is
then taken out of whatever the model wrapped it in (prose, a code fence), parsed, checked
against the schema, and kept as compact JSON. An answer that cannot be made to conform fails
the workflow with the reason: a client that asked for JSON must never get something else.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from jsonschema import exceptions as schema_errors
from jsonschema import validators
from pydantic import BaseModel, ConfigDict, Field, model_validator

from conductor.errors import ConductorError, InvalidRequest

MAX_SCHEMA_CHARS = 20_000  # the schema travels in the answering step's prompt
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


class AnswerFormatError(ConductorError):
    """The answer is not the JSON the client asked for; the message says how."""


class AnswerFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64)
    json_schema: dict[str, Any] | None = None
    # A workflow's json_object answer: the client's own instructions (its system and developer
    # text), where such a client describes the object it wants. The answering step is given
    # them, since it may see neither the question nor a step that saw it.
    instructions: str | None = None

    @model_validator(mode="after")
    def _schema_fits_its_type(self) -> AnswerFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only then")
        return self

    def check_schema(self, param: str) -> None:
        """Refuse a schema that is not one, or too long to give a model (InvalidRequest)."""
        if self.json_schema is None:
            return
        if len(json.dumps(self.json_schema)) > MAX_SCHEMA_CHARS:
            raise InvalidRequest(
                f"{param}: the schema is longer than {MAX_SCHEMA_CHARS} characters", param=param
            )
        try:
            validators.validator_for(self.json_schema).check_schema(self.json_schema)
        except schema_errors.SchemaError as exc:
            raise InvalidRequest(
                f"{param}: not a valid JSON Schema: {exc.message}", param=param
            ) from None

    def instruction(self) -> str:
        """What the answering step is told, after its subtask."""
        text = (
            "Write the answer as a single JSON object and nothing else: no words before or "
            "after it, no code fence."
        )
        if self.json_schema is not None:
            # Sorted: the same text however the schema was stored (JSONB reorders keys).
            text += " It must match this JSON Schema:\n" + json.dumps(
                self.json_schema, sort_keys=True
            )
        elif self.instructions:
            text += " What it must hold is in the client's instructions:\n" + self.instructions
        return text

    def conform(self, answer: str) -> str:
        """The answer as compact JSON that follows this format; AnswerFormatError if it
        cannot be."""
        value = _json_in(answer)
        if not isinstance(value, dict):
            raise AnswerFormatError(f"the answer is JSON but not an object: {answer[:200]!r}")
        if self.json_schema is not None:
            validator = validators.validator_for(self.json_schema)(self.json_schema)
            error = schema_errors.best_match(validator.iter_errors(value))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "the top level"
                raise AnswerFormatError(
                    f"the answer does not match the schema at {where}: {error.message}"
                )
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _json_in(answer: str) -> Any:
    """The JSON value an answer holds: all of it, or in a code fence, or from its first brace
    to its last."""
    candidates = [answer.strip()]
    candidates += [m.strip() for m in _FENCE.findall(answer)]
    start, end = answer.find("{"), answer.rfind("}")
    if 0 <= start < end:
        candidates.append(answer[start : end + 1])
    for text in candidates:
        try:
            return json.loads(text)
        except ValueError:
            continue
    raise AnswerFormatError(f"the answer is not JSON: {answer[:200]!r}")
