"""JSON values generated to be valid against a JSON schema: tool arguments, structured answers.

The subset real clients send (OpenAI strict schemas, Pydantic's ``model_json_schema()``, Anthropic
tool ``input_schema``): ``type`` (one or a list, ``"null"`` among them for nullable),
``properties`` / ``required`` / ``additionalProperties`` (false, or a schema: ``dict[str, X]``) /
``minProperties``, ``const``, ``enum``, ``anyOf`` / ``oneOf`` / ``allOf``, ``$ref`` into
``$defs`` / ``definitions`` (or ``#``, the root: recursive models), ``items`` / ``prefixItems`` /
``minItems`` / ``maxItems`` / ``uniqueItems``, ``minimum`` / ``maximum`` / ``exclusiveMinimum`` /
``exclusiveMaximum`` / ``multipleOf``, ``minLength`` / ``maxLength``, and string ``format``s
(date, date-time, time, email, uri, uuid, ipv4, ipv6, hostname, duration), and a ``pattern``
of literals, classes, groups, alternatives and repeats (lookarounds and back references are
not generated: a few candidates are tried, and the pattern may then be missed). Optional
properties appear half of the time.

Deterministic: the same schema and the same ``rng`` state give the same value. Recursion is
bounded: past :data:`SHALLOW_DEPTH` levels optional properties and array items beyond
``minItems`` are left out and ``anyOf`` prefers a branch that ends, so a recursive model
(a tree of nodes) comes out finite. Size is bounded (:data:`MAX_VALUES`, :data:`MAX_COUNT`,
:data:`MAX_LENGTH`): a schema asking for more gets a value that breaks it, not a hung server.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from re import _parser as _regex_parser  # type: ignore[attr-defined]
from typing import Any

WORDS = ("alpha", "north", "report", "paris", "summary", "blue", "order", "invoice", "draft")
SHALLOW_DEPTH = 4  # past this, generate only what the schema requires
MAX_DEPTH = 32  # a schema that requires deeper nesting than this gets null there
# A hostile schema (minItems 10**9, arrays of arrays of arrays…) must not hang the provider:
# past MAX_VALUES generated values the rest are null, and counts and lengths are capped.
MAX_VALUES = 5000
MAX_COUNT = 256  # items of an array, entries of a map
MAX_LENGTH = 10_000  # characters ``minLength`` pads all strings together to
_NUMBER_SPAN = 100.0  # the range drawn from when a bound is missing
_PATTERN_CANDIDATES = ("alpha", "ABC", "abc123", "123", "a1", "a-b", "x", "2025-01-31")
_FORMATS: dict[str, Any] = {
    "date": lambda rng: f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    "date-time": lambda rng: (
        f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
    ),
    "time": lambda rng: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
    "email": lambda rng: f"{rng.choice(WORDS)}@example.com",
    "uri": lambda rng: f"https://example.com/{rng.choice(WORDS)}",
    "url": lambda rng: f"https://example.com/{rng.choice(WORDS)}",
    "uuid": lambda rng: _uuid(rng),
    "ipv4": lambda rng: f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
    "ipv6": lambda rng: f"fd00::{rng.randint(1, 0xFFFF):x}",
    "hostname": lambda rng: f"{rng.choice(WORDS)}.example.com",
    "duration": lambda rng: f"PT{rng.randint(1, 59)}M",
}


def generate_value(schema: Any, rng: random.Random) -> Any:
    """A JSON value valid against ``schema`` (a dict; ``{}`` or ``true`` accept anything)."""
    return _Generator(schema if isinstance(schema, Mapping) else {}, rng).value(schema, 0)


class _Generator:
    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self.root = root
        self.rng = rng
        self.values = 0
        self.padding = MAX_LENGTH  # characters all strings together may still be padded to

    def value(self, schema: Any, depth: int) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            return None
        if schema is True or schema == {}:
            return self.rng.choice(WORDS)
        if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
            return None
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                return self.value(self.branch(branches, depth), depth + 1)
        kind = self.kind(schema)
        generator = _GENERATORS.get(kind)
        return None if generator is None else generator(self, schema, depth)

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """``schema`` with its ``$ref`` and ``allOf`` folded in (siblings of ``$ref`` apply too)."""
        seen: set[str] = set()
        while isinstance(schema.get("$ref"), str) and schema["$ref"] not in seen:
            seen.add(schema["$ref"])
            target = self.pointer(schema["$ref"])
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        parts = schema.get("allOf")
        if isinstance(parts, list) and parts:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                if isinstance(part, Mapping):
                    _merge(merged, self.resolve(part))
            return merged
        return schema

    def pointer(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            return {}  # remote references are not fetched
        node: Any = self.root
        for token in ref[1:].split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            node = node.get(token) if isinstance(node, Mapping) else None
        return node if isinstance(node, Mapping) else {}

    def branch(self, branches: list[Any], depth: int) -> Any:
        if depth >= SHALLOW_DEPTH:
            ending = [b for b in branches if not self.recurses(b)]
            if ending:
                return ending[0]
        return self.rng.choice(branches)

    def recurses(self, schema: Any) -> bool:
        """Whether a value of ``schema`` may need more levels (an object, array or reference)."""
        if not isinstance(schema, Mapping):
            return False
        if "$ref" in schema:
            return True
        return self.kind(schema) in ("object", "array")

    def kind(self, schema: Mapping[str, Any]) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            concrete = [k for k in kind if k != "null"]
            if not concrete or ("null" in kind and self.rng.random() < 0.25):
                return "null"
            return str(self.rng.choice(concrete))
        if isinstance(kind, str):
            return kind
        if any(key in schema for key in ("properties", "required", "additionalProperties")):
            return "object"
        if any(key in schema for key in ("items", "prefixItems", "minItems")):
            return "array"
        if any(key in schema for key in ("minimum", "maximum", "multipleOf")):
            return "number"
        return "string"

    def object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        required_names = (
            [name for name in required if isinstance(name, str)]
            if isinstance(required, list)
            else []
        )
        extra = schema.get("additionalProperties", True)
        result: dict[str, Any] = {}
        for name, sub_schema in properties.items():
            optional = name not in required_names
            if optional and (depth >= SHALLOW_DEPTH or self.rng.random() < 0.5):
                continue
            result[name] = self.value(sub_schema, depth + 1)
        wanted = min(MAX_COUNT, _non_negative_int(schema.get("minProperties"), 0))
        for name in required_names:
            if name not in result and extra is not False:
                result[name] = self.value(extra, depth + 1)
        if isinstance(extra, Mapping):  # a map (Pydantic ``dict[str, X]``): a few entries
            wanted = max(wanted, 0 if depth >= SHALLOW_DEPTH or properties else 1)
        if extra is not False:
            keys = (f"{WORDS[i % len(WORDS)]}{i // len(WORDS) or ''}" for i in range(MAX_COUNT))
            for key in keys:
                if len(result) >= wanted:
                    break
                result.setdefault(key, self.value(extra, depth + 1))
        return result

    def array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", {})
        minimum = min(MAX_COUNT, _non_negative_int(schema.get("minItems"), 0))
        maximum: int | None = _non_negative_int(schema.get("maxItems"), -1)
        if maximum == -1:
            maximum = None
        if items is False:  # only the prefix's items are allowed
            maximum = len(prefix) if maximum is None else min(maximum, len(prefix))
        shallow = depth >= SHALLOW_DEPTH
        low = minimum if shallow else max(minimum, 1)
        if maximum is not None:
            low = min(low, max(minimum, maximum))
        high = max(low, low + 2 if maximum is None else maximum)
        count = low if shallow else self.rng.randint(low, high)
        unique = schema.get("uniqueItems") is True
        result: list[Any] = []
        for _ in range(4 * count + 4):  # uniqueness may take a few more draws
            if len(result) >= count:
                break
            index = len(result)
            value = self.value(prefix[index] if index < len(prefix) else items, depth + 1)
            if not (unique and value in result):
                result.append(value)
        return result

    def string(self, schema: Mapping[str, Any], depth: int) -> str:
        rng = self.rng
        maker = _FORMATS.get(str(schema.get("format")))
        text = (
            maker(rng) if maker else " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        )
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and maker is None:
            text = _matching(pattern, text, rng)
        low = min(max(0, self.padding), _non_negative_int(schema.get("minLength"), 0))
        high = _non_negative_int(schema.get("maxLength"), max(low, len(text)))
        text = text.ljust(low, "x")[: max(low, high)]
        self.padding -= len(text)
        return text

    def integer(self, schema: Mapping[str, Any], depth: int) -> int:
        low, high = _bounds(schema)
        first, last = math.ceil(low[0]), math.floor(high[0])
        if low[1] and first == low[0]:
            first += 1
        if high[1] and last == high[0]:
            last -= 1
        step = schema.get("multipleOf")
        if isinstance(step, int) and not isinstance(step, bool) and step > 0:
            k_first, k_last = -((-first) // step), last // step
            return step * self.rng.randint(k_first, max(k_first, k_last))
        return self.rng.randint(first, max(first, last))

    def number(self, schema: Mapping[str, Any], depth: int) -> float | int:
        step = schema.get("multipleOf")
        if isinstance(step, int) and not isinstance(step, bool) and step > 0:
            return self.integer(schema, depth)
        (low, low_open), (high, high_open) = _bounds(schema)
        value = round(self.rng.uniform(low, high), 2)
        if (
            value < low
            or value > high
            or (low_open and value <= low)
            or (high_open and value >= high)
        ):
            value = (low + high) / 2  # rounding crossed a bound: the midpoint never does
        return value

    def boolean(self, schema: Mapping[str, Any], depth: int) -> bool:
        return self.rng.random() < 0.5

    def null(self, schema: Mapping[str, Any], depth: int) -> None:
        return None


_GENERATORS: dict[str, Any] = {
    "object": _Generator.object,
    "array": _Generator.array,
    "string": _Generator.string,
    "number": _Generator.number,
    "integer": _Generator.integer,
    "boolean": _Generator.boolean,
    "null": _Generator.null,
}


def _merge(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    """``allOf``: properties and required names add up; other keywords, the later wins."""
    for key, value in part.items():
        if key == "properties" and isinstance(value, Mapping):
            into["properties"] = {**into.get("properties", {}), **value}
        elif key == "required" and isinstance(value, list):
            into["required"] = [*into.get("required", []), *value]
        else:
            into.setdefault(key, value)


def _bounds(schema: Mapping[str, Any]) -> tuple[tuple[float, bool], tuple[float, bool]]:
    """(low, open), (high, open): ``exclusiveMinimum`` as a number (2020-12) or a flag (draft 4)."""

    def number(key: str) -> float | None:
        value = schema.get(key)
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )

    low, high = number("minimum"), number("maximum")
    low_open = high_open = False
    exclusive_low, exclusive_high = number("exclusiveMinimum"), number("exclusiveMaximum")
    if exclusive_low is not None and (low is None or exclusive_low >= low):
        low, low_open = exclusive_low, True
    elif schema.get("exclusiveMinimum") is True and low is not None:
        low_open = True
    if exclusive_high is not None and (high is None or exclusive_high <= high):
        high, high_open = exclusive_high, True
    elif schema.get("exclusiveMaximum") is True and high is not None:
        high_open = True
    if low is None:
        low = 0.0 if high is None or high > 0 else high - _NUMBER_SPAN
    if high is None:
        high = low + _NUMBER_SPAN if low > 0 else _NUMBER_SPAN
    return (low, low_open), (max(low, high), high_open)


def _matching(pattern: str, text: str, rng: random.Random) -> str:
    """A string ``pattern`` matches: one generated from the pattern's parse tree, else ``text``
    or one of a few candidates; ``text`` when none matches (lookarounds, back references)."""
    try:
        compiled = re.compile(pattern)
        generated = _from_regex(_regex_parser.parse(pattern), rng, [MAX_LENGTH])
    except (re.error, _Unsupported, RecursionError):
        return text
    for candidate in (generated, text, *_PATTERN_CANDIDATES):
        if compiled.search(candidate):
            return candidate
    return text


class _Unsupported(Exception):
    pass


_CATEGORIES = {
    "CATEGORY_DIGIT": "0123456789",
    "CATEGORY_WORD": "abcdefghijklmnopqrstuvwxyz_0123456789",
    "CATEGORY_SPACE": " ",
}
_ANY_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
_OPEN_REPEAT = 3  # ``*`` and ``+`` repeat at most this many times beyond their minimum


def _from_regex(parsed: Any, rng: random.Random, budget: list[int]) -> str:
    """A string for a parsed regular expression (``re._parser``'s tree, opcodes by name);
    ``budget[0]`` is the number of characters and repeats still allowed."""
    out: list[str] = []
    for opcode, argument in parsed:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Unsupported("too long")
        op = str(opcode)
        if op == "LITERAL":
            out.append(chr(argument))
        elif op == "ANY":
            out.append(rng.choice(_ANY_CHARACTERS))
        elif op == "IN":
            out.append(_from_class(argument, rng))
        elif op == "SUBPATTERN":
            out.append(_from_regex(argument[-1], rng, budget))
        elif op == "BRANCH":
            out.append(_from_regex(rng.choice(argument[1]), rng, budget))
        elif op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, item = argument
            high = min(high, low + _OPEN_REPEAT)
            count = rng.randint(low, high)
            if count > budget[0]:
                raise _Unsupported("too long")
            out.extend(_from_regex(item, rng, budget) for _ in range(count))
        elif op == "AT":
            continue  # anchors: the string generated is the whole match
        else:
            raise _Unsupported(op)
    return "".join(out)


def _from_class(items: Any, rng: random.Random) -> str:
    allowed: list[str] = []
    negated = False
    for opcode, argument in items:
        op = str(opcode)
        if op == "NEGATE":
            negated = True
        elif op == "LITERAL":
            allowed.append(chr(argument))
        elif op == "RANGE":
            allowed.extend(
                chr(code) for code in range(argument[0], min(argument[1], argument[0] + 64) + 1)
            )
        elif op == "CATEGORY" and str(argument) in _CATEGORIES:
            allowed.extend(_CATEGORIES[str(argument)])
        else:
            raise _Unsupported(op)
    if negated:
        allowed = [c for c in _ANY_CHARACTERS if c not in allowed]
    if not allowed:
        raise _Unsupported("empty class")
    return rng.choice(allowed)


def _uuid(rng: random.Random) -> str:
    digits = f"{rng.getrandbits(128):032x}"
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-a{digits[17:20]}-{digits[20:]}"


def _non_negative_int(value: Any, default: int) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    )
