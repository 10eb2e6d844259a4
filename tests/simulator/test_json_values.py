"""JSON values generated from JSON schemas are valid against them (checked by ``jsonschema``)."""

import datetime
import enum
import json
import random
import time
import uuid
from typing import Annotated, Literal

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from simulator.model.jsonvalues import generate_value


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    postcode: Annotated[str, Field(min_length=5, max_length=5)]


class Node(BaseModel):
    name: str
    children: list["Node"] = []


class Person(BaseModel):
    name: str
    age: Annotated[int, Field(ge=0, lt=130)]
    score: Annotated[float, Field(gt=0, le=1)]
    email: str | None = None
    colour: Colour
    kind: Literal["a", "b"]
    home: Address
    others: list[Address] = Field(min_length=1, max_length=3)
    tags: dict[str, int]
    tree: Node
    born: datetime.date
    seen_at: datetime.datetime
    id: uuid.UUID
    pair: tuple[int, str]
    either: int | str | None
    even: Annotated[int, Field(multiple_of=2, ge=10, le=20)]


HAND_WRITTEN = {
    "no constraints": {},
    "a bare string": {"type": "string"},
    "nullable by a type list": {"type": ["integer", "null"], "minimum": 5, "maximum": 5},
    "bounds only below": {"type": "number", "minimum": 1000},
    "bounds only above": {"type": "integer", "maximum": -50},
    "exclusive bounds of draft 4": {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "exclusiveMinimum": True,
        "exclusiveMaximum": True,
    },
    "closed object": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"const": 3}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "map with a minimum of entries": {
        "type": "object",
        "additionalProperties": {"type": "string", "format": "email"},
        "minProperties": 12,
    },
    "unique items from an enum": {
        "type": "array",
        "items": {"enum": ["x", "y", "z"]},
        "minItems": 2,
        "maxItems": 3,
        "uniqueItems": True,
    },
    "empty arrays allowed": {"type": "array", "items": {"type": "string"}, "maxItems": 0},
    "allOf merged": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
        ]
    },
    "oneOf tagged": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["kind", "lives"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "dog"}},
                "required": ["kind"],
            },
        ]
    },
    "every format": {
        "type": "object",
        "properties": {
            name: {"type": "string", "format": name}
            for name in ("date", "date-time", "time", "email", "uri", "uuid", "ipv4", "ipv6")
        },
        "required": ["date", "date-time", "time", "email", "uri", "uuid", "ipv4", "ipv6"],
    },
    "a simple pattern": {"type": "string", "pattern": "^[0-9]+$"},
    "a pattern of groups, classes and repeats": {
        "type": "string",
        "pattern": r"^(low|high)-[A-Z]{2,3}_\d+(\.[a-f0-9]{4})?[^a-z\s]\w*$",
    },
    "a pattern with a length": {"type": "string", "pattern": "^[a-c]+$", "maxLength": 2},
    "recursive through the root": {
        "type": "object",
        "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["next"],
    },
}
SCHEMAS = {
    **HAND_WRITTEN,
    "a Pydantic model": Person.model_json_schema(),
    "the openai SDK's strict form of it": to_strict_json_schema(Person),
}
VALIDATORS = {
    name: jsonschema.validators.validator_for(schema)(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for name, schema in SCHEMAS.items()
}


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=60)
@given(seed=st.integers())
def test_it_generates_values_valid_against_the_schema(name, seed):
    value = generate_value(SCHEMAS[name], random.Random(seed))

    VALIDATORS[name].validate(json.loads(json.dumps(value)))


@given(seed=st.integers())
def test_a_pydantic_model_validates_what_is_generated_from_its_schema(seed):
    value = generate_value(Person.model_json_schema(), random.Random(seed))

    person = Person.model_validate_json(json.dumps(value))

    assert 10 <= person.even <= 20 and person.even % 2 == 0


@pytest.mark.parametrize("seed", range(20))
def test_it_is_deterministic_per_seed(seed):
    schema = Person.model_json_schema()

    first = generate_value(schema, random.Random(seed))
    second = generate_value(schema, random.Random(seed))

    assert first == second


def test_different_seeds_give_different_values():
    schema = Person.model_json_schema()

    values = {json.dumps(generate_value(schema, random.Random(seed))) for seed in range(10)}

    assert len(values) == 10


def test_a_recursive_model_comes_out_finite_and_sometimes_nested():
    def depth(node):
        return 1 + max((depth(child) for child in node.get("children", [])), default=0)

    depths = [depth(generate_value(Node.model_json_schema(), random.Random(s))) for s in range(50)]

    assert max(depths) <= 6
    assert max(depths) >= 3, "children are generated, not always left out"


def test_optional_properties_appear_some_of_the_time():
    schema = Person.model_json_schema()

    emails = [generate_value(schema, random.Random(seed)).get("email") for seed in range(40)]

    assert "email" not in schema["required"]
    assert 5 < sum(email is not None for email in emails) < 35


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "array",
            "minItems": 10**9,
            "items": {"type": "array", "minItems": 10**9, "items": {"minLength": 10**9}},
        },
        {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 10**9},
        {"type": "string", "pattern": "^((a{1000}){1000}){1000}$"},
    ],
    ids=["arrays of a billion arrays", "a billion entries", "a pattern a billion long"],
)
def test_a_schema_asking_for_too_much_gets_a_bounded_value_quickly(schema):
    started = time.process_time()

    value = generate_value(schema, random.Random(1))

    assert len(json.dumps(value)) < 10_000_000
    assert time.process_time() - started < 5, "bounded work, not a hung provider"
