"""Tool-call arguments generated from a tool's JSON schema, and their malformed variants.

A well-formed call is a JSON object valid against the tool's schema (the subset
:mod:`simulator.model.jsonvalues` generates; optional properties appear half of the time). A
malformed call is either not JSON at all (OpenAI: ``arguments`` is a string, so a truncated or
broken string) or, where the protocol carries a parsed object (Anthropic ``tool_use.input``), an
object violating the schema.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from simulator.model.jsonvalues import generate_value


def generate_arguments(schema: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """A JSON object valid against ``schema`` (a tool's parameters; ``{}`` means no arguments)."""
    if not any(key in schema for key in ("type", "anyOf", "oneOf", "enum", "$ref", "allOf")):
        schema = {**schema, "type": "object"}
    value = generate_value(schema, rng)
    return value if isinstance(value, dict) else {"value": value}


def broken_json(arguments: Mapping[str, Any], rng: random.Random) -> str:
    """Arguments text that does not parse as JSON, in one of the ways real models get it wrong."""
    text = json.dumps(arguments)
    way = rng.randrange(3)
    if way == 0 and len(text) > 2:
        return text[: rng.randint(1, len(text) - 1)]  # cut off mid-way
    if way == 1:
        return text.replace('"', "'")  # Python-style quotes
    return text[:-1] + ",}" if text.endswith("}") else text + ","  # trailing comma


def schema_violation(
    arguments: Mapping[str, Any], schema: Mapping[str, Any], rng: random.Random
) -> dict[str, Any]:
    """A parsed object that breaks ``schema``: a required property missing, or of a wrong type."""
    broken = dict(arguments)
    required = schema.get("required")
    if isinstance(required, list) and required:
        del_name = rng.choice(required)
        broken.pop(del_name, None)
        return broken
    if broken:
        name = rng.choice(sorted(broken))
        broken[name] = [] if not isinstance(broken[name], list) else "not-a-list"
        return broken
    return {"unexpected": True} if schema.get("additionalProperties") is False else {"": None}
