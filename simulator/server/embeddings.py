"""OpenAI's ``POST /v1/embeddings`` on the simulator's OpenAI wire: parsing and the answer.

The vectors are deterministic: each input's vector is a unit vector drawn from a generator
seeded by the input itself (its text, or its token ids), so the same input always embeds the
same way and a test can check an answer without storing one. ``dimensions`` shortens it (and it
is normalised again, as OpenAI's ``text-embedding-3`` models do). Usage counts each input in the
simulator's native tokens (a token array: its length), summed over the batch.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from dataclasses import dataclass
from typing import Any

import orjson

from simulator.model import count_text_tokens
from simulator.server.common import BadRequest, caller_of, load_json_object

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
ENCODINGS = ("float", "base64")

Input = str | list[int]


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    inputs: tuple[Input, ...]
    dimensions: int | None
    encoding_format: str
    caller: str | None

    @property
    def input_tokens(self) -> int:
        return sum(
            len(item) if isinstance(item, list) else count_text_tokens(item) for item in self.inputs
        )


def embeddings_parse(body: bytes) -> EmbeddingsRequest:
    data = load_json_object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", param="model")
    inputs = _inputs(data.get("input"))
    dimensions = data.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise BadRequest(
            f"Invalid value for 'dimensions': expected an integer >= 1, got {dimensions!r}.",
            param="dimensions",
        )
    encoding = data.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise BadRequest(
            f"Invalid value for 'encoding_format': expected 'float' or 'base64', got {encoding!r}.",
            param="encoding_format",
        )
    return EmbeddingsRequest(model, inputs, dimensions, str(encoding), caller_of(data.get("user")))


def _inputs(value: Any) -> tuple[Input, ...]:
    """A string, a list of strings, a token array, or a list of token arrays."""
    message = (
        "'input' must be a string, an array of strings, an array of integers or an array of "
        "arrays of integers, and not empty."
    )
    if isinstance(value, str):
        return (value,) if value else _refuse(message)
    if not isinstance(value, list) or not value or len(value) > MAX_INPUTS:
        _refuse(message)
    if all(_is_token(item) for item in value):
        return (list(value),)
    if all(isinstance(item, str) and item for item in value):
        return tuple(value)
    if all(isinstance(item, list) and item and all(map(_is_token, item)) for item in value):
        return tuple(value)
    return _refuse(message)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _refuse(message: str) -> tuple[Input, ...]:
    raise BadRequest(message, param="input")


def embedding_vector(item: Input, dimensions: int) -> list[float]:
    """The unit vector of one input: a function of the input and the dimension only."""
    key = item.encode() if isinstance(item, str) else orjson.dumps(item)
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    rng = random.Random(seed)
    vector = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def embeddings_body(request: EmbeddingsRequest, native_dimensions: int) -> bytes:
    """OpenAI's ``list`` of ``embedding`` objects with the batch's usage."""
    size = min(request.dimensions or native_dimensions, native_dimensions)
    data = []
    for index, item in enumerate(request.inputs):
        vector = embedding_vector(item, size)
        embedding: list[float] | str = vector
        if request.encoding_format == "base64":  # little-endian float32, as OpenAI sends it
            embedding = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = request.input_tokens
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": request.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
