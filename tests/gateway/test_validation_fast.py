"""The chat body's quick check (``plainly_valid``, gateway/validation.py) says yes only where the
serializer says yes: a body it passes skips the serializer, so a yes the serializer would refuse
would let an invalid request through."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from gateway.validation import _CHAT_COMPLETION, ROLES, chat_request_parse, plainly_valid

odd_texts = st.sampled_from(
    ["", " ", " gpt ", "a" * 200, " " + "a" * 200 + " ", "a" * 201, "x\x00y", "é", "\t", "ok"]
)
texts = st.one_of(st.text(max_size=8), odd_texts)
numbers = st.one_of(
    st.integers(min_value=-3, max_value=5),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 0.0, -0.0, 1.0, 2.0, 2.0000001, 1e-300]),
)
anything = st.one_of(st.none(), st.booleans(), numbers, texts, st.just([]), st.just({}))
messages = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(st.sampled_from([*ROLES, "bot", "", "USER"]), anything),
        "content": st.one_of(texts, st.none(), st.just([{"type": "text", "text": "hi"}]), numbers),
        "name": anything,
        "tool_call_id": anything,
        "tool_calls": st.one_of(st.none(), st.just([])),
        "extra": anything,
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(texts, anything),
        "messages": st.one_of(st.lists(messages, max_size=3), anything),
        "stream": anything,
        "stream_options": st.one_of(
            st.fixed_dictionaries({}, optional={"include_usage": anything, "other": anything}),
            anything,
        ),
        "max_tokens": anything,
        "max_completion_tokens": anything,
        "temperature": anything,
        "top_p": anything,
        "n": anything,
        "user": anything,
        "stop": anything,
        "tools": anything,
        "metadata": anything,
        "unknown_field": anything,
    },
)


# Near the common body: a valid one with a few fields changed, where most yes-or-no cases lie.
near_plain = st.builds(
    lambda changes, conversation: {
        "model": "demo-model",
        "messages": conversation,
        "max_tokens": 16,
        "temperature": 0.7,
        **changes,
    },
    st.dictionaries(
        st.sampled_from(
            [
                "model",
                "stream",
                "stream_options",
                "max_tokens",
                "max_completion_tokens",
                "temperature",
                "top_p",
                "n",
                "user",
                "stop",
                "unknown_field",
            ]
        ),
        st.one_of(anything, st.fixed_dictionaries({"include_usage": st.booleans()})),
        max_size=3,
    ),
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}
            ),
            messages,
        ),
        max_size=3,
    ),
)


def serializer_accepts(body: dict) -> bool:
    try:
        _CHAT_COMPLETION.run_validation(body)
    except serializers.ValidationError:
        return False
    return True


@settings(max_examples=1000)  # ~4 % of these are a yes: ~40 yes checked per run
@given(st.one_of(bodies, near_plain))
def test_it_passes_no_body_the_serializer_refuses(body):
    if plainly_valid(body):
        assert serializer_accepts(body), body


@given(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text()}
        ),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
)
def test_it_passes_the_common_body_itself_and_returns_it_unchanged(conversation, stream):
    body = {"model": "demo-model", "messages": conversation, "max_tokens": 16, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    assert plainly_valid(body)
    assert serializer_accepts(body)
    assert chat_request_parse(orjson.dumps(body), max_bytes=10**6) == body


def test_it_leaves_a_body_with_tools_or_parts_to_the_serializer():
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert plainly_valid(base)
    assert not plainly_valid({**base, "tools": []})
    assert not plainly_valid({**base, "messages": [{"role": "user", "content": []}]})
    assert not plainly_valid({**base, "messages": [{"role": "tool", "content": "x"}]})
    assert not plainly_valid({**base, "model": "modèle"})  # non-ASCII: the serializer looks
