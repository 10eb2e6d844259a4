"""Cache-aware stickiness end to end (SPEC G12, issue 4).

"A multi-turn conversation stays on its first provider; it moves when that provider goes down."
Conversations (named by ``x-session-id``) run on ``e2e/sticky``, chat-large as served by alpha
and beta — the two endpoints that discount cached input, so staying is worth it (a pinned
conversation also moves when its cache would save less than the routing-cost gap, G12).
Half the conversations start on each provider (their first turn ignores the other one); later
turns carry no preferences, so only the pin keeps them where they are.
"""

from __future__ import annotations

import os
import uuid

import pytest

from tests.e2e.routing_support import (
    chat,
    endpoints_of,
    incident,
    incident_wait_over,
    quiet_market,
    route,
    routing_config,
    served_by,
)
from tests.stack import Stack, free_port

pytestmark = pytest.mark.e2e

MODEL = "e2e/sticky"
STICKY = {
    "slug": MODEL,
    "endpoints": [e for e in endpoints_of("acme/chat-large") if e["provider"] != "gamma"],
}
UPSTREAM = {e["provider"]: e["upstream_model"] for e in STICKY["endpoints"]}
CONVERSATIONS = 6
# A long shared document: the prefix a provider's prompt cache keeps warm between turns.
DOCUMENT = "Read this contract carefully. " + "The party of the first part shall " * 400


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=quiet_market(tmp_path_factory.mktemp("market")),
        latency_scale=0.05,
        celery=False,
        config_edit=routing_config(free_port(), [STICKY]),
    )
    try:
        yield running.start()
    finally:
        running.stop()


class Conversation:
    """One multi-turn conversation: each turn sends the whole history, like a chat client."""

    def __init__(self, stack: Stack, start_on: str) -> None:
        self.stack = stack
        # The first turn is routed by the algorithm among the endpoints it allows; ignoring the
        # other one makes half the conversations start where a fresh one would seldom go.
        self.first_preferences = {"ignore": [p for p in UPSTREAM if p != start_on]}
        self.session = f"conv-{uuid.uuid4().hex[:8]}"
        self.messages = [{"role": "user", "content": DOCUMENT}]
        self.providers: list[str] = []
        self.sticky: list[str] = []
        self.attempts: list[int] = []
        self.refused: list[str] = []

    def turn(self) -> str:
        request = {"model": MODEL, "messages": self.messages, "max_tokens": 30}
        if not self.providers:
            request["provider"] = self.first_preferences
        response = chat(self.stack, request, headers={"x-session-id": self.session})
        provider = served_by(response)
        self.providers.append(provider)
        self.sticky.append(route(response)["sticky"])
        self.attempts.append(int(response.headers["x-switchyard-attempts"]))
        self.refused.append(route(response).get("refused", ""))
        answer = response.json()["choices"][0]["message"]["content"]
        self.messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"And clause {len(self.providers) + 1}?"},
        ]
        return provider


def test_it_keeps_a_conversation_on_its_first_provider_and_moves_it_when_that_goes_down(stack):
    starts = sorted(UPSTREAM) * (CONVERSATIONS // len(UPSTREAM))
    conversations = [Conversation(stack, start_on) for start_on in starts]
    for _ in range(4):
        for conversation in conversations:
            conversation.turn()

    for c in conversations:
        # Later turns carry no preferences: the pin alone keeps them where the first one went.
        assert len(set(c.providers)) == 1, f"{c.session} moved: {c.providers}"
        assert c.sticky[0].startswith("no")  # the first turn is routed by the algorithm
        assert all(s == "yes(warm)" for s in c.sticky[1:]), c.sticky
    first = {c.session: c.providers[0] for c in conversations}
    assert sorted(first.values()) == sorted(starts)

    # alpha (cheaper for a long prompt, so what the algorithm prefers for a new conversation)
    # goes down: its conversations move, and must then stay on beta when alpha is back.
    down = first[conversations[0].session]
    other = next(p for p in UPSTREAM if p != down)
    ends = incident(stack, down, model=UPSTREAM[down], **{"for": "5s"}, overload_rate=1.0)
    try:
        for conversation in conversations:
            conversation.turn()  # turn 5, while `down` refuses everything
    finally:
        incident_wait_over(stack, down, ends)
    for conversation in conversations:
        conversation.turn()  # turns 6 and 7, `down` healthy again
        conversation.turn()

    for c in conversations:
        if first[c.session] == down:
            # Tried where it was pinned, failed, retried on the other provider — or, once
            # earlier conversations' failures opened `down`'s breaker (G7), sent straight there.
            assert c.providers[4] == other, c.providers
            if c.attempts[4] == 1:
                assert f"{down}:breaker" in c.refused[4], c.refused
            else:
                assert c.attempts[4] == 2, c.attempts
            # …and pinned there now: it does not go back when `down` recovers.
            assert c.providers[5:] == [other, other], c.providers
            assert c.sticky[5:] == ["yes(warm)", "yes(warm)"]
        else:
            assert c.providers[4:] == [first[c.session]] * 3
            assert c.attempts[4] == 1
