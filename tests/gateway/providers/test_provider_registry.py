"""The adapter registry, the SSE parser, and the adapters' independence from Django/Redis."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gateway.providers import PROTOCOLS, adapter_for
from gateway.providers.base import SSEEvent, SSEParser

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_it_finds_an_adapter_per_protocol(protocol: str) -> None:
    assert adapter_for(protocol).protocol == protocol
    assert adapter_for(protocol) is adapter_for(protocol)  # stateless, shared


def test_it_refuses_an_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="gemini"):
        adapter_for("gemini")


def test_it_serves_every_protocol_of_the_reference_config() -> None:
    config = yaml.safe_load((ROOT / "config" / "switchyard.yaml").read_text())
    assert {p["protocol"] for p in config["providers"]} <= set(PROTOCOLS)


def test_it_keeps_adapters_free_of_django_redis_and_http() -> None:
    forbidden = {"django", "redis", "celery", "httpx", "aiohttp", "rest_framework"}
    for source in (ROOT / "gateway" / "providers").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & forbidden, (source.name, names)


def test_it_parses_sse_framing() -> None:
    raw = (
        b": keep-alive comment\r\n"
        b"event: message_start\r\n"
        b'data: {"a":\r\n'
        b"data: 1}\r\n"
        b"\r\n"
        b"data:no-space\n"
        b"id: 7\n"
        b"\n"
        b"\n"
        b"data: bad \xff byte\n\n"
        b"data: never terminated"
    )
    assert list(SSEParser().feed(raw)) == [
        SSEEvent("message_start", '{"a":\n1}'),
        SSEEvent("message", "no-space"),
        SSEEvent("message", "bad \ufffd byte"),
    ]


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_it_parses_the_same_events_however_the_bytes_are_split(cuts: list[int]) -> None:
    raw = b"".join(
        f'event: e{i}\ndata: {{"text": "h\u00e9llo {i} \u2014 \u4f60\u597d"}}\n\n'.encode()
        for i in range(5)
    )
    expected = list(SSEParser().feed(raw))
    parser, events, position = SSEParser(), [], 0
    for cut in cuts:
        events.extend(parser.feed(raw[position : position + cut]))
        position += cut
    events.extend(parser.feed(raw[position:]))
    assert events == expected and len(expected) == 5
