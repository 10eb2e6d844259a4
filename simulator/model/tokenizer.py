"""The simulator's "native tokenizer" and its output text.

Counting rule (deterministic, deliberately not ``len(text) / 4``): a run of ASCII letters is one
token per started 4 letters, a run of digits one per started 3 digits, every other
non-whitespace character (punctuation, symbols, non-ASCII letters) is one token, whitespace is
free. A prompt adds :data:`MESSAGE_OVERHEAD` per message, :data:`REPLY_PRIMING` once, and each
tool its name, description and compact JSON schema plus :data:`TOOL_OVERHEAD`. English prose comes
out ~15 % above chars/4, JSON and code much higher, so a gateway's chars/4 estimate has a realistic,
content-dependent error.

Generated output is made of one-token pieces (a space and a word of at most 4 letters, or a
single punctuation mark), so ``count_text_tokens("".join(pieces)) == len(pieces)``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence

from simulator.model.request import ToolSpec

MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
TOOL_OVERHEAD = 8
IMAGE_TOKENS = 765  # a fixed charge per image part; images are not the simulator's subject

# One C-level findall does the whole count: greedy {1,4} splits a letter run into ceil(n/4) pieces.
_PIECE = re.compile(r"[A-Za-z]{1,4}|[0-9]{1,3}|[^\sA-Za-z0-9]")

_WORDS = (
    "the a of and to in is it that for on with as at by from this be are was not or can will "
    "data flow node rate path time load work call test plan step code file line text unit note "
    "each more some then when what into over only also just like very well long fast slow high "
    "low new old next last best real true good part case form page list item task user team"
)
# Roughly one punctuation mark per dozen words, as in prose.
OUTPUT_PIECES: tuple[str, ...] = (
    *(" " + word for word in _WORDS.split()),
    *(",", ".", ",", ".", "."),
)


def count_text_tokens(text: str) -> int:
    """Native tokens in ``text``."""
    return len(_PIECE.findall(text))


def count_tool_tokens(tool: ToolSpec) -> int:
    schema = json.dumps(tool.parameters, separators=(",", ":"), sort_keys=True)
    return (
        count_text_tokens(tool.name)
        + count_text_tokens(tool.description)
        + count_text_tokens(schema)
        + TOOL_OVERHEAD
    )


def count_prompt_tokens(
    messages: Iterable[str], tools: Sequence[ToolSpec] = (), *, images: int = 0
) -> int:
    """Prompt tokens of a request: each message's flattened text, the tools, and images."""
    total = REPLY_PRIMING + images * IMAGE_TOKENS
    for text in messages:
        total += count_text_tokens(text) + MESSAGE_OVERHEAD
    for tool in tools:
        total += count_tool_tokens(tool)
    return total


# A fixed stream of prose that answers are sliced from: one random offset per answer instead of
# one random draw per token keeps a 5,000-requests/s server off the RNG (pieces are immutable).
_POOL = tuple(random.Random(0).choices(OUTPUT_PIECES, k=1 << 16))


def generate_pieces(rng: random.Random, tokens: int) -> list[str]:
    """``tokens`` one-token pieces of filler prose; the first has no leading space."""
    if tokens <= 0:
        return []
    pieces: list[str] = []
    while len(pieces) < tokens:
        want = min(tokens - len(pieces), len(_POOL))
        start = rng.randrange(len(_POOL) - want + 1)
        pieces += _POOL[start : start + want]
    first = pieces[0].lstrip()
    pieces[0] = first if first not in (",", ".") else "So"
    return pieces
