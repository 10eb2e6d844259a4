"""The simulator's native tokenizer: deterministic, and deliberately not chars / 4."""

import random

from hypothesis import given
from hypothesis import strategies as st

from simulator.model import ToolSpec, count_prompt_tokens, count_text_tokens, generate_pieces
from simulator.model.tokenizer import MESSAGE_OVERHEAD, REPLY_PRIMING, TOOL_OVERHEAD


def test_it_counts_word_pieces_digits_and_punctuation():
    assert count_text_tokens("hello world") == 4  # hell·o worl·d
    assert count_text_tokens("a cat, a dog.") == 6
    assert count_text_tokens("1234567") == 3  # 123·456·7
    assert count_text_tokens('{"k": [1, 2]}') == 11
    assert count_text_tokens("   \n\t ") == 0
    assert count_text_tokens("café") == 2  # non-ASCII letters are one token each


def test_it_differs_from_a_chars_over_four_estimate_depending_on_content():
    prose = "The quarterly report shows revenue growth across every region we operate in. " * 20
    code = '{"id": 17, "items": [{"sku": "A-1", "qty": 3}, {"sku": "B-22", "qty": 10}]}' * 10

    prose_ratio = count_text_tokens(prose) / (len(prose) / 4)
    code_ratio = count_text_tokens(code) / (len(code) / 4)

    assert 1.05 < prose_ratio < 1.4
    assert code_ratio > 1.5


def test_it_adds_message_and_tool_overheads_to_a_prompt():
    tool = ToolSpec("f", {"type": "object"}, "desc")
    schema_tokens = count_text_tokens('{"type":"object"}')

    total = count_prompt_tokens(["hi", "there"], [tool])

    expected = REPLY_PRIMING + (1 + MESSAGE_OVERHEAD) + (2 + MESSAGE_OVERHEAD)
    expected += 1 + 1 + schema_tokens + TOOL_OVERHEAD
    assert total == expected


@given(st.integers(min_value=0, max_value=3000), st.integers())
def test_it_generates_output_whose_native_count_is_the_planned_count(tokens, seed):
    pieces = generate_pieces(random.Random(seed), tokens)

    assert len(pieces) == tokens
    assert count_text_tokens("".join(pieces)) == tokens
