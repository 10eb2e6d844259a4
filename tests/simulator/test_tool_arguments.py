"""Tool-call arguments generated from JSON schemas, and their malformed variants."""

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.model.toolcalls import broken_json, generate_arguments, schema_violation

ORDER = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "email": {"type": "string", "format": "email"},
                "vip": {"type": "boolean"},
            },
            "required": ["email"],
        },
        "lines": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 8},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["sku", "qty"],
            },
        },
        "priority": {"enum": ["low", "high"]},
        "note": {"type": ["string", "null"]},
        "coupon": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "ship_on": {"type": "string", "format": "date"},
    },
    "required": ["customer", "lines", "priority"],
}


def check_order(arguments):
    assert set(arguments) <= set(ORDER["properties"])
    assert isinstance(arguments["customer"]["email"], str) and "@" in arguments["customer"]["email"]
    assert 1 <= len(arguments["lines"]) <= 3
    for line in arguments["lines"]:
        assert isinstance(line["sku"], str) and len(line["sku"]) <= 8
        assert isinstance(line["qty"], int) and 1 <= line["qty"] <= 9
    assert arguments["priority"] in ("low", "high")
    assert isinstance(arguments.get("coupon", ""), str | int)


@given(st.integers())
def test_it_generates_arguments_that_satisfy_the_schema(seed):
    arguments = generate_arguments(ORDER, random.Random(seed))

    check_order(json.loads(json.dumps(arguments)))


@pytest.mark.parametrize("seed", range(30))
def test_it_breaks_json_so_that_it_does_not_parse(seed):
    arguments = generate_arguments(ORDER, random.Random(seed))

    with pytest.raises(json.JSONDecodeError):
        json.loads(broken_json(arguments, random.Random(seed)))


@pytest.mark.parametrize("seed", range(30))
def test_it_violates_the_schema_by_dropping_a_required_property(seed):
    arguments = generate_arguments(ORDER, random.Random(seed))

    broken = schema_violation(arguments, ORDER, random.Random(seed))

    assert not set(ORDER["required"]) <= set(broken)


def test_it_tolerates_schemas_without_properties_or_type():
    assert generate_arguments({}, random.Random(1)) == {}
    assert isinstance(generate_arguments({"type": "string"}, random.Random(1))["value"], str)
