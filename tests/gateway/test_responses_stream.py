"""The Responses stream renderer: chat chunks in, the Responses event sequence out, which the
official openai SDK's own stream accumulator turns into the final Response."""

import asyncio
import json

import openai
from openai._models import construct_type_unchecked
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from gateway.doors.base import Rendering
from gateway.doors.responses_stream import ResponsesStream
from gateway.errors import UpstreamTimeout
from gateway.providers.base import SSEEvent, SSEParser, Usage

HOW = Rendering(
    call_id="gen-feed",
    model="acme/chat-large",
    created=1_700_000_000,
    provider="alpha",
    cost=lambda usage: 0.5,
)
UPSTREAM = SSEEvent("message", "{}")


async def never_kept(response):
    raise AssertionError("a broken stream's Response is not stored")


def chunk(**delta):
    return {"choices": [{"index": 0, "delta": delta}]}


def call(index, *, id=None, name=None, arguments=""):
    function = {"arguments": arguments}
    if name:
        function["name"] = name
    return {"index": index, **({"id": id} if id else {}), "function": function}


def events(data: bytes):
    parsed = list(SSEParser().feed(data))
    bodies = [json.loads(e.data) for e in parsed]
    assert all(e.event == body["type"] for e, body in zip(parsed, bodies, strict=True))
    return bodies


USAGE = Usage(input_tokens=7, output_tokens=3)


def run(feeds, *, usage=USAGE, finish="stop", body=None):
    kept = []

    async def keep(response):
        response["store"] = True
        kept.append(response)

    renderer = ResponsesStream(body or {"model": "acme/chat-large", "input": "x"}, HOW, keep=keep)
    out = b"".join(renderer.feed(UPSTREAM, chunks) for chunks in feeds)
    out += asyncio.run(renderer.close(usage, finish))
    return events(out), kept


def sdk_final(bodies):
    """What the openai SDK's ``responses.stream`` makes of these events (it raises on any
    event out of order or an identity that changed)."""
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for body in bodies:
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=body))
    return state._completed_response


def test_it_streams_text_in_the_responses_event_sequence():
    bodies, kept = run([[chunk(role="assistant")], [chunk(content="Hel")], [chunk(content="lo")]])

    assert [b["type"] for b in bodies] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [b["sequence_number"] for b in bodies] == list(range(len(bodies)))
    assert bodies[0]["response"]["status"] == "in_progress"
    assert bodies[6]["text"] == "Hello"
    completed = bodies[-1]["response"]
    assert completed["status"] == "completed" and completed["id"] == "resp_feed"
    assert completed["usage"]["input_tokens"] == 7 and completed["usage"]["output_tokens"] == 3
    assert completed["usage"]["total_tokens"] == 10 and completed["usage"]["cost"] == 0.5
    assert kept == [completed] and completed["store"] is True  # stored before it went out

    final = sdk_final(bodies)
    assert final.output_text == "Hello"
    assert final.usage.total_tokens == 10


def test_it_streams_function_calls_as_items_with_argument_deltas():
    bodies, _ = run(
        [
            [chunk(content="Let me check.")],
            [chunk(tool_calls=[call(0, id="call_a", name="get_weather")])],
            [chunk(tool_calls=[call(0, arguments='{"city":')])],
            [chunk(tool_calls=[call(0, arguments='"Oslo"}')])],
            [chunk(tool_calls=[call(1, id="call_b", name="get_time", arguments="{}")])],
        ],
        finish="tool_calls",
    )

    kinds = [b["type"] for b in bodies]
    assert kinds.count("response.output_item.added") == 3
    assert kinds.count("response.function_call_arguments.delta") == 3
    done = [b for b in bodies if b["type"] == "response.function_call_arguments.done"]
    assert [(d["name"], d["arguments"]) for d in done] == [
        ("get_weather", '{"city":"Oslo"}'),
        ("get_time", "{}"),
    ]
    final = sdk_final(bodies)
    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    assert final.output[1].call_id == "call_a" and final.output[1].arguments == '{"city":"Oslo"}'
    assert final.output[2].call_id == "call_b"
    assert final.status == "completed"


def test_it_ends_a_stream_cut_at_its_limit_as_incomplete():
    bodies, _ = run([[chunk(content="one two")]], finish="length")

    assert bodies[-1]["type"] == "response.incomplete"
    assert bodies[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    item_done = next(b for b in bodies if b["type"] == "response.output_item.done")
    assert item_done["item"]["status"] == "incomplete"


def test_it_ends_a_broken_stream_with_an_error_and_a_failed_response():
    renderer = ResponsesStream({"model": "m", "input": "x"}, HOW, keep=never_kept)
    out = renderer.feed(UPSTREAM, [chunk(content="partial")])
    out += renderer.fail(UpstreamTimeout("The provider stopped sending."))
    bodies = events(out)

    assert [b["type"] for b in bodies][-2:] == ["error", "response.failed"]
    assert bodies[-2]["code"] == "upstream_timeout"
    assert bodies[-2]["message"] == "The provider stopped sending."
    failed = bodies[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {
        "code": "upstream_timeout",
        "message": "The provider stopped sending.",
    }


def test_it_opens_the_stream_even_when_it_fails_before_any_output():
    renderer = ResponsesStream({"model": "m", "input": "x"}, HOW, keep=never_kept)
    bodies = events(renderer.fail(UpstreamTimeout("gone")))

    assert [b["type"] for b in bodies] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
