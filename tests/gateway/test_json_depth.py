"""Every door's body is one JSON object nested at most MAX_JSON_DEPTH levels
(``json_object_parse``, gateway/validation.py); a body with too few brackets to be that deep
is not walked, so the bound must hold exactly at its edge, whatever the body's other brackets."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.validation import MAX_JSON_DEPTH, json_object_parse


def nested(levels: int) -> object:
    """A value of ``levels`` levels: 1 is ``[]``, 2 is ``[[]]``."""
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


def parse(body: dict[str, object]) -> dict[str, object]:
    return json_object_parse(orjson.dumps(body), max_bytes=10_000_000)


@pytest.mark.parametrize("padding", ["", "[" * 200, "{}" * 200])  # more brackets in a string
def test_the_body_with_its_deepest_value_is_at_most_max_json_depth_levels(padding):
    # The body object is the first level.
    assert parse({"extra": nested(MAX_JSON_DEPTH - 1), "note": padding})
    with pytest.raises(InvalidRequest, match=f"extra: nested deeper than {MAX_JSON_DEPTH}"):
        parse({"extra": nested(MAX_JSON_DEPTH), "note": padding})


def test_a_deep_value_among_many_shallow_ones_is_found():
    body = {"messages": [{"role": "user", "content": "hi"}] * 100, "metadata": nested(100)}
    with pytest.raises(InvalidRequest, match="metadata: nested deeper"):
        parse(body)
