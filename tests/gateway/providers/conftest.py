"""Shared fixtures for the provider adapter tests: recorded streams and SSE replay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.providers.base import JSON, SSEEvent, SSEParser, StreamTranslator

RECORDED = Path(__file__).parent / "recorded"


@pytest.fixture
def recorded() -> Callable[[str], bytes]:
    """Bytes of a recorded provider stream in ``recorded/``."""
    return lambda name: (RECORDED / name).read_bytes()


@pytest.fixture
def sse_events() -> Callable[[bytes], list[SSEEvent]]:
    """All events of a raw stream, parsed as the pipeline parses them."""
    return lambda raw: list(SSEParser().feed(raw))


@pytest.fixture
def replay() -> Callable[[StreamTranslator, bytes], list[JSON]]:
    """Every chunk a translator produces for a raw stream, fed one byte at a time."""

    def run(translator: StreamTranslator, raw: bytes) -> list[JSON]:
        parser, chunks = SSEParser(), []
        for i in range(len(raw)):  # one byte at a time: the worst split the network can do
            for event in parser.feed(raw[i : i + 1]):
                chunks.extend(translator.feed(event))
        return chunks

    return run
