"""Tolerant parser for Conductor output. It never raises, whatever the model wrote.

Accepted forms, tried in this order:
1. the paper's three Python lists (``model_id = [...]`` etc.) anywhere in the text, reasoning
   around them; the last occurrence of each list wins (drafts in the reasoning come first);
2. a JSON object with the keys ``model_id``, ``subtasks`` and ``access_list``;
3. a JSON object ``{"steps": [{"model_id", "subtask", "access_list"}, ...]}`` (the form that
   constrained decoding produces).
The parser only extracts; the validator decides whether the plan is acceptable.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

# Longer output is cut before parsing so a runaway generation cannot make parsing slow.
MAX_PARSE_CHARS = 100_000
_MAX_JSON_STARTS = 200
# Occurrences of each list name tried, from the last: bounds the work on repetitive output.
_MAX_LIST_CANDIDATES = 16
_LIST_NAMES = ("model_id", "subtasks", "access_list")
_OPENERS = {"[": "]", "{": "}", "(": ")"}
_FENCE = re.compile(r"```[a-zA-Z]*")
_OBJECT_START = re.compile(r"\{\s*[\"}]")

PlanForm = Literal["lists", "json", "json-steps"]


@dataclass(frozen=True)
class ParsedLists:
    model_id: list[Any]
    subtasks: list[Any]
    access_list: list[Any]
    form: PlanForm


@dataclass(frozen=True)
class ParseFailure:
    reason: str


def parse_plan(text: object) -> ParsedLists | ParseFailure:
    if not isinstance(text, str):
        return ParseFailure(f"expected text, got {type(text).__name__}")
    text = _FENCE.sub("", text[:MAX_PARSE_CHARS])
    try:
        found = _parse_lists(text) or _parse_json(text)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        return ParseFailure(f"unparseable output ({type(exc).__name__})")
    if found is None:
        return ParseFailure(
            "no plan found: expected the lists model_id, subtasks and access_list, "
            "or a JSON object with them"
        )
    return found


def _parse_lists(text: str) -> ParsedLists | None:
    values = {name: _last_list_literal(text, name) for name in _LIST_NAMES}
    if any(v is None for v in values.values()):
        return None
    return ParsedLists(
        model_id=values["model_id"] or [],
        subtasks=values["subtasks"] or [],
        access_list=values["access_list"] or [],
        form="lists",
    )


def _last_list_literal(text: str, name: str) -> list[Any] | None:
    pattern = re.compile(rf"\b{name}\s*[:=]\s*\[")
    for match in list(pattern.finditer(text))[::-1][:_MAX_LIST_CANDIDATES]:
        start = match.end() - 1
        end = _balanced_end(text, start)
        if end is None:
            continue
        try:
            value = ast.literal_eval(text[start:end])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, list):
            return value
    return None


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the bracket that closes ``text[start]``, skipping quoted strings."""
    stack: list[str] = []
    quote: str | None = None
    i = start
    while i < len(text):
        char = text[i]
        if quote is not None:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in _OPENERS:
            stack.append(_OPENERS[char])
        elif char in ")]}":
            if not stack or stack.pop() != char:
                return None
            if not stack:
                return i + 1
        i += 1
    return None


def _parse_json(text: str) -> ParsedLists | None:
    for obj in reversed(_json_objects(text)):
        parsed = _from_json_object(obj)
        if parsed is not None:
            return parsed
    return None


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in the text, from the positions where one can start (``{"`` or
    ``{}``), so stray braces cost nothing and the number of tries stays bounded."""
    decoder = json.JSONDecoder()
    objects: list[dict[str, Any]] = []
    resume = 0
    for attempt, match in enumerate(_OBJECT_START.finditer(text)):
        if attempt >= _MAX_JSON_STARTS:
            break
        if match.start() < resume:
            continue
        try:
            value, end = decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # JSONDecodeError, huge numbers, deep nesting
            continue
        if isinstance(value, dict):
            objects.append(value)
            resume = end
    return objects


def _from_json_object(obj: dict[str, Any]) -> ParsedLists | None:
    if all(isinstance(obj.get(name), list) for name in _LIST_NAMES):
        return ParsedLists(obj["model_id"], obj["subtasks"], obj["access_list"], form="json")
    steps = obj.get("steps")
    if isinstance(steps, list):
        items = [s if isinstance(s, dict) else {} for s in steps]
        return ParsedLists(
            model_id=[s.get("model_id") for s in items],
            subtasks=[s.get("subtask") for s in items],
            access_list=[s.get("access_list") for s in items],
            form="json-steps",
        )
    return None
