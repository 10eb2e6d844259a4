"""The embeddings door: parsing into the canonical request (estimate: input only, output 0),
refusals naming the field, and the answer in OpenAI's embeddings shape."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.doors import door_for
from gateway.doors.base import Rendering
from gateway.doors.embeddings import EMBEDDINGS_DOOR, TEXT_FAMILY, TOKENS_FAMILY
from gateway.errors import BodyTooLarge, InvalidRequest
from gateway.providers.base import Completion, Usage
from quotas.core.estimate import Corrections


def parse(body: object):
    return EMBEDDINGS_DOOR.parse(orjson.dumps(body), {})


def test_a_string_is_estimated_by_the_heuristic_and_reserves_no_output():
    request = parse({"model": "acme/embed-small", "input": "x" * 41})

    assert request.operation == "embed" and request.features == frozenset({"embeddings"})
    assert request.estimate.input_tokens == 11  # ceil(41 / 4)
    assert request.estimate.max_output == 0
    assert request.estimate.prompt_family == TEXT_FAMILY
    assert not request.stream and request.native is None
    demand = request.estimate.demand(
        model="m", route="alpha", default_output_tokens=400, max_output=1, corrections=Corrections()
    )
    assert (demand.input_tokens, demand.output_tokens) == (11, 0)


def test_a_batch_sums_its_inputs():
    request = parse({"model": "m", "input": ["abcd", "abcde", "a"]})
    assert request.estimate.input_tokens == 1 + 2 + 1


@pytest.mark.parametrize(
    ("value", "tokens"), [([5, 6, 7], 3), ([[1, 2], [3], [4, 5, 6, 7]], 7), ([[0]], 1)]
)
def test_token_arrays_are_counted_exactly_in_a_class_of_their_own(value, tokens):
    request = parse({"model": "m", "input": value})
    assert request.estimate.input_tokens == tokens
    assert request.estimate.prompt_family == TOKENS_FAMILY


def test_it_reads_the_options_the_spine_needs():
    request = parse(
        {
            "model": "alias-of-something",
            "input": "hi",
            "user": "u-7",
            "models": ["acme/embed-large"],
            "provider": {"only": ["alpha"]},
            "dimensions": 256,
            "encoding_format": "base64",
        }
    )
    assert request.model == "alias-of-something" and request.models == ("acme/embed-large",)
    assert request.user == "u-7" and request.preferences.only == ("alpha",)
    assert request.body["dimensions"] == 256  # the body goes to the adapter as it came


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "", "input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": None}, "input"),
        ({"model": "m", "input": ""}, "input[0]"),
        ({"model": "m", "input": {}}, "input"),
        ({"model": "m", "input": [True]}, "input[0]"),
        ({"model": "m", "input": [2**31]}, "input[0]"),
        ({"model": "m", "input": [[]]}, "input[0]"),
        ({"model": "m", "input": ["a"] * 2049}, "input"),
        ({"model": "m", "input": "x", "dimensions": True}, "dimensions"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": "x", "user": 5}, "user"),
        ({"model": "m", "input": "x", "provider": []}, "provider"),
        ({"model": "m", "input": "x", "provider": {"sort": "vibes"}}, "provider"),
        ({"model": "m", "input": "x", "models": "m2"}, "models"),
        ({"model": "m", "input": "x", "stream": True}, "stream"),
    ],
)
def test_a_bad_field_is_refused_by_name(body, param):
    with pytest.raises(InvalidRequest) as raised:
        parse(body)
    assert raised.value.param == param


def test_a_body_that_is_not_one_json_object_is_refused(settings):
    for raw in (b"", b"[1]", b"{"):
        with pytest.raises(InvalidRequest):
            EMBEDDINGS_DOOR.parse(raw, {})
    settings.MAX_REQUEST_BODY_BYTES = 10
    with pytest.raises(BodyTooLarge):
        EMBEDDINGS_DOOR.parse(orjson.dumps({"model": "m", "input": "long enough"}), {})


def test_the_answer_names_the_model_provider_usage_and_cost():
    request = parse({"model": "text-embedding-3-small", "input": ["a", "b"]})
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [1.0]}],
        "model": "upstream-name",
    }
    how = Rendering(
        call_id="gen-1",
        model="acme/embed-small",
        created=0,
        provider="alpha",
        cost=lambda usage: usage.input_tokens * 0.02 / 1e6,
    )
    usage = Usage(input_tokens=9)
    result = asyncio.run(
        EMBEDDINGS_DOOR.answer(request, Completion(body, usage, "stop"), usage, how)
    )
    assert result["model"] == "acme/embed-small" and result["provider"] == "alpha"
    assert result["usage"] == {"prompt_tokens": 9, "total_tokens": 9, "cost": 9 * 0.02 / 1e6}
    assert result["data"] == body["data"]


def test_a_deferred_embeddings_job_finds_its_door_again():
    assert door_for("embeddings") is EMBEDDINGS_DOOR
