"""What the vendor fakes answer when a request asks for JSON natively: a JSON value that follows
the schema it sent, as a provider's constrained decoding guarantees."""

from __future__ import annotations

from typing import Any

# What a fake answers, in its "prose unless asked natively" mode, to a request that asks for
# JSON only in the prompt: no braces, so nothing in it can be taken for a JSON object.
PROSE = "Happy to help: the answer, in plain words, is that it depends."


def schema_instance(schema: Any, root: Any = None) -> Any:
    """A small value ``schema`` accepts: every property of an object, no items in an array
    (``minItems`` if it asks for some), the first of an ``enum`` or of ``anyOf``/``oneOf``
    choices, local ``$ref``s followed."""
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return {}
    if "$ref" in schema:
        target: Any = root
        for name in str(schema["$ref"]).removeprefix("#/").split("/"):
            target = target[name] if name else target
        return schema_instance(target, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return schema_instance(schema[key][0], root)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: schema_instance(sub, root) for name, sub in properties.items()}
    if kind == "array":
        return [schema_instance(schema.get("items"), root)] * schema.get("minItems", 0)
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    return {"string": "x" * max(1, schema.get("minLength", 1)), "boolean": True}.get(kind)
