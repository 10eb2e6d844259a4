"""Tool-call arguments generated from a tool's JSON schema, and their malformed variants.

A well-formed call is a JSON object satisfying the schema's ``type``, ``required``,
``properties``, ``enum``/``const``, ``items``, ``minimum``/``maximum``, ``minLength``/``maxLength``,
``minItems``/``maxItems`` and ``anyOf``/``oneOf`` (optional properties appear half of the time;
``$ref`` and other keywords are ignored). A malformed call is either not JSON at all (OpenAI:
``arguments`` is a string, so a truncated or broken string) or, where the protocol carries a
parsed object (Anthropic ``tool_use.input``), an object violating the schema.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

_WORDS = ("alpha", "north", "report", "paris", "summary", "blue", "order", "invoice", "draft")
_MAX_DEPTH = 6


def generate_arguments(schema: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """A JSON object valid against ``schema`` (a tool's parameters; ``{}`` means no arguments)."""
    if "type" not in schema and not any(key in schema for key in ("anyOf", "oneOf", "enum")):
        return _object(schema, rng, 0)
    value = _generate(schema, rng, 0)
    return value if isinstance(value, dict) else {"value": value}


def _generate(schema: Any, rng: random.Random, depth: int) -> Any:
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return _generate(rng.choice(branches), rng, depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        return _generate(schema["allOf"][0], rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [item for item in kind if item != "null"]
        kind = non_null[0] if non_null else "null"
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _GENERATORS.get(kind, _null)(schema, rng, depth)


def _object(schema: Mapping[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    required_names = set(required) if isinstance(required, list) else set()
    result: dict[str, Any] = {}
    for name, sub_schema in properties.items():
        if name in required_names or rng.random() < 0.5:
            result[name] = _generate(sub_schema, rng, depth + 1)
    for name in sorted(required_names - set(properties)):
        result[name] = rng.choice(_WORDS)  # required but undescribed: any value will do
    return result


def _array(schema: Mapping[str, Any], rng: random.Random, depth: int) -> list[Any]:
    low = _int_or(schema.get("minItems"), 1)
    high = max(low, _int_or(schema.get("maxItems"), low + 2))
    return [
        _generate(schema.get("items", {}), rng, depth + 1) for _ in range(rng.randint(low, high))
    ]


def _string(schema: Mapping[str, Any], rng: random.Random, depth: int) -> str:
    fmt = schema.get("format")
    if fmt == "date":
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if fmt == "date-time":
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z"
    if fmt == "email":
        return f"{rng.choice(_WORDS)}@example.com"
    if fmt in ("uri", "url"):
        return f"https://example.com/{rng.choice(_WORDS)}"
    text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    low = _int_or(schema.get("minLength"), 0)
    high = _int_or(schema.get("maxLength"), max(low, len(text)))
    text = text.ljust(low, "x")
    return text[: max(low, high)]


def _number(schema: Mapping[str, Any], rng: random.Random, depth: int) -> float:
    low, high = _bounds(schema, 0.0, 100.0)
    return round(rng.uniform(low, high), 2)


def _integer(schema: Mapping[str, Any], rng: random.Random, depth: int) -> int:
    low, high = _bounds(schema, 0.0, 100.0)
    return rng.randint(int(low), max(int(low), int(high)))


def _boolean(schema: Mapping[str, Any], rng: random.Random, depth: int) -> bool:
    return rng.random() < 0.5


def _null(schema: Mapping[str, Any], rng: random.Random, depth: int) -> None:
    return None


_GENERATORS: dict[str, Any] = {
    "object": _object,
    "array": _array,
    "string": _string,
    "number": _number,
    "integer": _integer,
    "boolean": _boolean,
    "null": _null,
}


def _int_or(value: Any, default: int) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    )


def _bounds(schema: Mapping[str, Any], low: float, high: float) -> tuple[float, float]:
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    if isinstance(minimum, int | float) and not isinstance(minimum, bool):
        low = float(minimum)
        high = max(high, low)
    if isinstance(maximum, int | float) and not isinstance(maximum, bool):
        high = float(maximum)
        low = min(low, high)
    return low, high


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
