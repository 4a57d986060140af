"""The Conductor protocol: prompt rendering, tolerant parsing, strict validation, fallback."""

from conductor.protocol.parser import ParsedLists, ParseFailure, parse_plan
from conductor.protocol.prompt import render_output, render_pool, render_prompt
from conductor.protocol.schema import plan_schema, text_limits
from conductor.protocol.validator import Validation, fallback_plan, validate_plan

__all__ = [
    "ParseFailure",
    "ParsedLists",
    "Validation",
    "fallback_plan",
    "parse_plan",
    "plan_schema",
    "render_output",
    "render_pool",
    "render_prompt",
    "text_limits",
    "validate_plan",
]
