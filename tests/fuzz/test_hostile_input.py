"""Hand-written hostile input against a live gateway: depth, size, NUL, odd unicode, huge numbers
and odd headers. Each is answered with a 4xx in the error envelope, or served when it is a
legitimate request, and leaves nothing held behind (no concurrency taken, no lease, no claimed
Idempotency-Key).

Numbers, decided with OpenAI's API in mind: it refuses a negative temperature and a max_tokens
beyond any model's output (400), and so does Switchyard; ``1e400`` is not a number any JSON
parser here can hold (400 invalid_json). A whole float such as ``max_tokens: 1.0`` is an integer
in JSON Schema's sense, but OpenAI refuses it ("expected an integer, but got a decimal
number") and so does Switchyard: a provider behind it may be as strict. A NUL inside message
content is valid JSON that OpenAI accepts and the contract allows: served, except on a deferred
request, whose body PostgreSQL cannot store (400 there).
"""

from __future__ import annotations

import json
import socket
import uuid

import httpx
import orjson
import pytest

from tests.fuzz.settled import leftovers
from tests.stack import wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"
HI = [{"role": "user", "content": "hi"}]
# Slow enough that a stream is still running when a test looks (at 0.01 it is over in ~0.1 s).
LATENCY_SCALE = 0.25
# The settings default (switchyard/settings.py MAX_REQUEST_BODY_BYTES); the stack keeps it.
MAX_REQUEST_BODY_BYTES = 10 * 1024 * 1024


def body(**fields):
    return {"model": "acme/chat-small", "messages": HI, "max_tokens": 16, **fields}


def nested(levels):
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def deep_tool(levels):
    return [{"type": "function", "function": {"name": "f", "parameters": nested(levels)}}]


@pytest.fixture(autouse=True)
def nothing_left_held(stack):
    yield
    try:
        wait_until(lambda: not leftovers(stack), timeout=10, what="nothing held")
    except TimeoutError:
        pytest.fail(f"left held after the request: {leftovers(stack)}")


def post(stack, payload=None, *, content=None, headers=None):
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        json=payload,
        content=content,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        | (headers or {}),
        timeout=60,
    )


def assert_refused(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param", "reason"}
    assert error["message"] and error["code"] and error["reason"]
    if param is not None:
        assert error["param"] == param


def assert_served(response):
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"


# (case, JSON body, param of the 400)
REFUSED = [
    ("metadata 300 deep", body(metadata=nested(300)), "metadata"),
    ("response_format 300 deep", body(response_format=nested(300)), "response_format"),
    ("tool parameters 300 deep", body(tools=deep_tool(300)), "tools"),
    ("an unknown field 300 deep", body(extra=nested(300)), "extra"),
    ("4,097 messages", body(messages=HI * 4097), "messages"),
    ("NUL in the model", body(model="acme/chat-small\x00"), "model"),
    ("NUL in a tool call id", body(messages=[
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c\x00", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "x", "tool_call_id": "c\x00"},
    ]), None),
    ("NUL in user", body(user="u\x00"), "user"),
    ("negative temperature", body(temperature=-0.5), "temperature"),
    ("max_tokens 2**64", body(max_tokens=2**64), "max_tokens"),
    ("max_tokens 1.5", body(max_tokens=1.5), "max_tokens"),
    ("max_tokens 1.0", body(max_tokens=1.0), "max_tokens"),
    ("max_tokens negative", body(max_tokens=-1), "max_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "payload", "param"), REFUSED, ids=[c[0] for c in REFUSED])
def test_it_refuses_hostile_bodies_in_the_envelope(stack, case, payload, param):
    # The standard library, as orjson refuses to write an integer past 64 bits.
    assert_refused(post(stack, content=json.dumps(payload).encode()), 400, param)


# (case, raw JSON text) the parser itself refuses: 400 invalid_json.
UNPARSABLE = [
    ("a lone surrogate", b'{"model": "acme/chat-small", "messages": '
                         b'[{"role": "user", "content": "\\ud800"}]}'),
    ("a number past double range", b'{"model": "acme/chat-small", "messages": '
                                   b'[{"role": "user", "content": "hi"}], "temperature": 1e400}'),
    ("invalid UTF-8", b'{"model": "acme/chat-small", "messages": '
                      b'[{"role": "user", "content": "\xff\xfe"}]}'),
]  # fmt: skip


@pytest.mark.parametrize(("case", "raw"), UNPARSABLE, ids=[c[0] for c in UNPARSABLE])
def test_it_refuses_what_is_not_json_in_the_envelope(stack, case, raw):
    response = post(stack, content=raw)
    assert_refused(response, 400)
    assert response.json()["error"]["code"] == "invalid_json"


SERVED = [
    ("right-to-left marks", body(messages=[{"role": "user", "content": "\u202eolleh\u200f"}])),
    ("emoji and a surrogate pair", body(messages=[{"role": "user", "content": "hi 👋🏽 \U0001f600"}])),
    ("combining marks", body(messages=[{"role": "user", "content": "Z\u0351\u0352\u0353a"}])),
    ("NUL in content", body(messages=[{"role": "user", "content": "a\x00b"}])),
    ("temperature 0 and 2", body(temperature=0, top_p=1)),
    ("metadata at OpenAI's bounds", body(metadata={f"k{i}": "v" * 512 for i in range(16)})),
    ("tool parameters 30 deep", body(tools=deep_tool(30))),
    ("4,096 messages", body(messages=HI * 4096)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "payload"), SERVED, ids=[c[0] for c in SERVED])
def test_it_serves_odd_but_legitimate_bodies(stack, case, payload):
    assert_served(post(stack, payload))


def test_it_refuses_nul_in_a_deferred_body(stack):
    deferred = {"Authorization": "Bearer sk-sy-test-acme-indexer-0001", "Prefer": "respond-async"}
    payload = body(messages=[{"role": "user", "content": "a\x00b"}])
    assert_refused(post(stack, payload, headers=deferred), 400)


def test_it_refuses_a_body_just_over_the_limit_with_413(stack):
    padding = MAX_REQUEST_BODY_BYTES - len(
        orjson.dumps(body(messages=[{"role": "user", "content": ""}]))
    )
    payload = orjson.dumps(body(messages=[{"role": "user", "content": "x" * (padding + 1)}]))
    assert len(payload) == MAX_REQUEST_BODY_BYTES + 1
    assert_refused(post(stack, content=payload), 413)


# (case, headers, status, param)
HEADERS = [
    ("an Idempotency-Key of 10,000 characters", {"Idempotency-Key": "k" * 10_000}, 400,
     "Idempotency-Key"),
    ("a non-ASCII Idempotency-Key", {"Idempotency-Key": "clé-1".encode()}, 400,
     "Idempotency-Key"),
    ("a garbage X-Switchyard-Workload", {"X-Switchyard-Workload": "!!garbage'; drop table"}, 400, None),
    ("an X-Switchyard-Workload of 10,000 characters", {"X-Switchyard-Workload": "w" * 10_000},
     400, None),
    ("a non-ASCII X-Switchyard-Workload", {"X-Switchyard-Workload": "intéractive".encode()}, 400,
     None),
    ("a non-ASCII Authorization", {"Authorization": "Bearer sk-sy-tést".encode()}, 401, None),
    ("a garbage Prefer", {"Prefer": 'respond-async; wait=-1, x="'}, 200, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "headers", "status", "param"), HEADERS, ids=[c[0] for c in HEADERS]
)
def test_it_answers_odd_headers_in_the_envelope(stack, case, headers, status, param):
    response = post(stack, body(), headers=headers)
    if status == 200:
        assert_served(response)
    else:
        assert_refused(response, status, param)


def test_it_serves_a_non_ascii_session_id(stack):
    assert_served(post(stack, body(), headers={"X-Session-Id": "sessión-١٢٣".encode()}))


def test_an_idempotency_key_refused_for_its_body_is_not_claimed(stack):
    key = f"hostile-{uuid.uuid4()}"
    assert_refused(post(stack, body(metadata=nested(300)), headers={"Idempotency-Key": key}), 400)
    assert_served(post(stack, body(), headers={"Idempotency-Key": key}))


@pytest.mark.parametrize(
    "path",
    ["/v1/jobs/a%00b", "/v1/generation?id=gen-a%00b", "/v1/models/acme%00chat"],
    ids=["job id", "generation id", "model id"],
)
def test_it_refuses_nul_in_ids(stack, path):
    response = httpx.get(f"{stack.base_url}{path}", headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code in (400, 404), response.text
    assert_refused(response, response.status_code)


@pytest.mark.parametrize(
    "header", [b"X-Session-Id: a\x00b", b"Idempotency-Key: a\x00b"], ids=["session", "key"]
)
def test_it_refuses_nul_in_a_header_in_the_envelope(stack, header):
    content = orjson.dumps(body())
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(content)}\r\n".encode()
        + header + b"\r\nConnection: close\r\n\r\n" + content
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", stack.gateway_port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert set(orjson.loads(content)["error"]) == {"message", "type", "code", "param", "reason"}


def test_the_check_sees_what_a_request_in_flight_holds(stack):
    """What ``nothing_left_held`` looks for is really there while a request runs: its lease and
    its claimed Idempotency-Key, its concurrency (a stream of 4,000 tokens outlasts the look)."""
    key = f"in-flight-{uuid.uuid4()}"
    payload = body(stream=True, max_tokens=4000)
    with httpx.stream(
        "POST",
        f"{stack.base_url}/v1/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {KEY}", "Idempotency-Key": key},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()
        next(chunks)
        held = leftovers(stack)
        for _ in chunks:
            pass
    assert held.keys() == {
        "buckets below capacity",
        "leases indexed",
        "idempotency keys still claimed",
    }, held
