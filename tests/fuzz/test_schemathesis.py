"""Schemathesis against a live gateway: every /v1 operation, valid and broken requests drawn from
the published contract (a trimmed copy, ``trimmed.py``), with a fixed seed.

Asserted over the whole run: no response is a 5xx, every error body is in the envelope that
``GET /v1/openapi.json`` documents (its ErrorEnvelope component), and once the deferred jobs
have finished nothing is left held: every concurrency bucket is full, the lease index is empty
and no Idempotency-Key is still claimed.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
import jsonschema
import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.fuzz.settled import settle
from tests.fuzz.trimmed import trimmed

pytestmark = pytest.mark.e2e

# Interactive (acme/search/web) and deferrable (acme/search/indexer: background) callers.
KEYS = ("sk-sy-test-acme-web-0001", "sk-sy-test-acme-indexer-0001")
# An embedding model and an alias too: each door is also sent the other's models.
MODELS = [
    "acme/chat-small",
    "acme/chat-large",
    "acme/embed-small",
    "claude-sonnet-4-5",
    "acme/no-such-model",
]
# Examples drawn per operation and mode (positive: valid under the contract; negative: each
# breaks it somewhere). A chat body takes ~20–30 ms to draw from the trimmed schema.
EXAMPLES = {
    "POST /v1/chat/completions": 750,
    "POST /v1/responses": 400,
    "GET /v1/models": 1,  # no input: one distinct request
    "GET /v1/openapi.json": 1,
}
DEFAULT_EXAMPLES = 150
# One request in UNAUTHENTICATED has no key or an unknown one: a 401.
UNAUTHENTICATED = 10
UNKNOWN_KEY = "sk-sy-no-such-key-0000"


@pytest.fixture(scope="module")
def published(stack):
    return httpx.get(f"{stack.base_url}/v1/openapi.json", timeout=10).json()


def test_generated_requests_never_fail_and_leave_nothing_held(stack, published):
    envelope = published["components"]["schemas"]["ErrorEnvelope"]
    anthropic = published["components"]["schemas"]["AnthropicError"]  # the Messages door's
    schema = schemathesis.openapi.from_dict(trimmed(published, MODELS))
    run = Run(stack.base_url, envelope, anthropic)
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        examples = EXAMPLES.get(operation.label, DEFAULT_EXAMPLES)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run.fuzz(operation, mode, examples)
    sent, statuses, failures = run.sent, run.statuses, run.failures

    elapsed = time.monotonic() - started
    print(f"\nschemathesis: {sent} requests in {elapsed:.1f} s; none drawn: {run.unbreakable}")
    for (label, status), count in sorted(statuses.items()):
        print(f"  {label} {status}: {count}")
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:20])
    operations = {label for label, _ in statuses}
    # every published operation was exercised (some paths have two: GET and DELETE, GET and POST)
    assert operations == {
        f"{method.upper()} {path}"
        for path, item in published["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert sent >= 2000
    left = settle(stack)
    claimed = left.get("idempotency keys still claimed", [])
    assert left == {}, "\n".join(
        [str(left), *(run.answered.get(owner, owner) for owner in claimed)]
    )


class Run:
    def __init__(self, base_url: str, envelope: dict, anthropic: dict) -> None:
        self.base_url = base_url
        self.envelope = envelope
        self.anthropic = anthropic
        self.session = requests.Session()
        self.sent = 0
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.failures: list[str] = []
        self.unbreakable: list[str] = []
        self.answered: dict[str, str] = {}

    def fuzz(self, operation, mode: GenerationMode, examples: int) -> None:
        @settings(
            max_examples=examples,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: every case counts once
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def send(case) -> None:
            self.send(case, operation.label, mode)

        try:
            send()
        except Unsatisfiable:  # nothing to break (no input, or only a free-form path segment)
            self.unbreakable.append(f"{mode.value} {operation.label}")

    def send(self, case, label: str, mode: GenerationMode) -> None:
        self.sent += 1
        headers = {}
        if self.sent % UNAUTHENTICATED:
            headers["Authorization"] = f"Bearer {KEYS[self.sent % 3 == 0]}"
        elif self.sent % (2 * UNAUTHENTICATED):
            headers["Authorization"] = f"Bearer {UNKNOWN_KEY}"
        response = case.call(
            base_url=self.base_url, session=self.session, headers=headers, timeout=30
        )
        self.statuses[(label, response.status_code)] += 1
        if "Idempotency-Key" in case.headers:  # to name what a key left claimed answered
            [request_id] = response.headers.get("x-request-id") or ["?"]
            self.answered[request_id] = f"{label} -> {response.status_code}: {case.body!r:.300}"
        messages = label.startswith("POST /v1/messages")
        problem = _problem(response, self.anthropic if messages else self.envelope)
        if problem:
            self.failures.append(
                f"{mode.value} {label} -> {response.status_code}: {problem}\n"
                f"  {case.as_curl_command(headers=headers)}\n  {response.content[:300]!r}"
            )


def _problem(response, envelope) -> str:
    if response.status_code >= 500:
        return "a server error"
    if response.status_code < 400:
        return ""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return "an error body that is not JSON"
    try:
        jsonschema.validate(body, envelope)
    except jsonschema.ValidationError as error:
        return f"an error body outside the envelope: {error.message}"
    return ""
