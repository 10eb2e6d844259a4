"""Relaying a provider stream to the client in its door's protocol (SPEC C10).

The reservation holds the maximum output while the stream runs (its lease renewed) — or, for a
workload class that reserves in increments, a first step that grows as tokens arrive
(``gateway.steps``, fed by ``relay``'s ``progress``); when the stream ends — completed, failed,
or cut by a client that went away — the actual usage is reconciled and the unused part
released. A client disconnect cancels this generator (Django
does that), which closes the upstream response and so cancels the provider's work.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.dispatch import UPSTREAM_WORDS
from gateway.doors.base import StreamRenderer
from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from gateway.providers.base import Outcome, SSEParser, StreamError, StreamTranslator, Usage
from gateway.upstream import UpstreamStream
from quotas.core.estimate import CHARS_PER_TOKEN


@dataclass
class StreamEnd:
    """How a relayed stream ended, for reconciliation and the ledger."""

    usage: Usage
    usage_reported: bool  # False: the stream was cut before the provider's usage chunk
    finish_reason: str
    status: int  # 200, or 499 client gone, 502 / 504 provider failure mid-stream
    reason: str
    ttft: float | None  # since the request reached the gateway
    upstream_ttft: float | None  # since the upstream call started: the provider's own TTFT
    tool_calls: list[dict[str, Any]]  # reassembled from the deltas, for the quality check


async def relay(
    response: UpstreamStream,
    translator: StreamTranslator,
    renderer: StreamRenderer,
    *,
    estimated_input_tokens: int,
    started: float,
    upstream_started: float,
    finish: Callable[[StreamEnd], Awaitable[None]],
    progress: Callable[[int], None] | None = None,
) -> AsyncIterator[bytes]:
    """The provider's events, translated to OpenAI chunks (what the relay measures), written
    out in the door's protocol by ``renderer``; ``progress`` hears the output tokens made so
    far (estimated from the characters) after each read, for a reservation in steps."""
    parser = SSEParser()
    ttft: float | None = None
    upstream_ttft: float | None = None
    streamed_chars = 0
    tool_calls: dict[int, dict[str, Any]] = {}
    status, reason, completed = 200, "", False
    # Chunks of one network read go out as one write: a burst of events costs one ASGI send,
    # and a paced stream (one event per read) is relayed as promptly as before.
    out: list[bytes] = []
    try:
        try:
            async for raw in response.aiter_bytes():
                for event in parser.feed(raw):
                    chunks = translator.feed(event)
                    for chunk in chunks:
                        if ttft is None and _first_token(chunk):
                            ttft = time.monotonic() - started
                            upstream_ttft = time.monotonic() - upstream_started
                        streamed_chars += _collect(chunk, tool_calls)
                    out.append(renderer.feed(event, chunks))
                if progress is not None and streamed_chars:
                    progress(math.ceil(streamed_chars / CHARS_PER_TOKEN))
                if translator.done:
                    break
                if out:
                    yield b"".join(out)
                    out.clear()
            completed = translator.done
            if completed:
                out.append(await renderer.close(translator.usage, translator.finish_reason))
            else:
                status, reason = 502, "upstream_stream_incomplete"
                out.append(renderer.fail(UpstreamError("The provider ended the stream early.")))
        except StreamError as exc:
            outcome = exc.classified.outcome
            status, reason = 502, f"upstream_{outcome.value}"
            # The provider's own words only when they are about the caller's request (H1).
            said = exc.classified.message if outcome is Outcome.REQUEST_ERROR else ""
            message = f"The provider failed mid-stream: {said or UPSTREAM_WORDS[outcome]}"
            out.append(renderer.fail(UpstreamError(message)))
        except TimeoutError:  # aiohttp's read timeout between two reads is one too
            status, reason = 504, "upstream_timeout"
            out.append(renderer.fail(UpstreamTimeout("The provider stopped sending.")))
        except aiohttp.ClientError:
            status, reason = 502, "upstream_unavailable"
            out.append(renderer.fail(UpstreamUnavailable("The connection to the provider broke.")))
        yield b"".join(out)
    except Exception:  # a bug of ours: the ledger says so (the pipeline settles and logs)
        status, reason = 500, "internal_error"
        raise
    finally:
        if status == 200 and not completed:
            status, reason = 499, "client_disconnected"
        usage = translator.usage
        end = StreamEnd(
            # Cut before the usage chunk: the provider still charged for what it made.
            usage=usage
            or Usage(
                input_tokens=estimated_input_tokens,
                output_tokens=math.ceil(streamed_chars / CHARS_PER_TOKEN),
            ),
            usage_reported=usage is not None,
            finish_reason=translator.finish_reason or "",
            status=status,
            reason=reason,
            ttft=ttft,
            upstream_ttft=upstream_ttft,
            tool_calls=[tool_calls[i] for i in sorted(tool_calls)],
        )
        await _whole(_end(response, finish, end))


async def _end(
    response: UpstreamStream, finish: Callable[[StreamEnd], Awaitable[None]], end: StreamEnd
) -> None:
    await response.aclose()
    await finish(end)


async def _whole(ending: Coroutine[Any, Any, None]) -> None:
    """Run a stream's ending to its end, then pass on a cancellation that came meanwhile.

    The ending (reconcile the grant, write the ledger row, store or give back the
    Idempotency-Key) runs after the last chunk went out but before the response is complete. A
    client that hangs up in between has the proxy handler cancel the request's task, which
    stopped the ending at its next await: no ledger row, the key claimed until its 24 h TTL
    (the fuzz suite's keys left claimed). In a task of its own, shielded, it finishes."""
    task = asyncio.ensure_future(ending)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.done():  # the ending itself was cancelled: nothing left to wait for
                raise
            cancelled = exc
    if cancelled is not None:
        raise cancelled


def _first_token(chunk: dict[str, Any]) -> bool:
    """TTFT ends at the first chunk with output — not at the role-only opening chunk."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or choice.get("finish_reason"):
            return True
    return False


def _collect(chunk: dict[str, Any], tool_calls: dict[int, dict[str, Any]]) -> int:
    """Reassemble tool calls from a chunk's deltas; returns the characters it carried."""
    count = 0
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        count += len(delta.get("content") or "")
        for part in delta.get("tool_calls") or ():
            function = part.get("function") or {}
            call = tool_calls.setdefault(
                part.get("index", 0), {"function": {"name": "", "arguments": ""}}
            )
            call["function"]["name"] += function.get("name") or ""
            arguments = function.get("arguments") or ""
            call["function"]["arguments"] += arguments
            count += len(arguments)
    return count
