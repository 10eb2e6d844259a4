"""Traffic from a market file's ``traffic`` section: diurnal arrivals, conversations, whales.

Per route, conversations start as a Poisson process whose rate follows a daily sine (trough at
local midnight, peak at noon): ``rate(t) = mean / turns · (1 + A·sin(2π·t/day − π/2))``, so the
route's *requests* average ``requests_per_minute.mean`` once every turn is counted. Arrivals are
drawn by thinning at the peak rate, which needs no integral of the rate.

A conversation has a geometric number of turns (mean ``conversation_turns.mean``). Its prompts
are that many draws from ``input_tokens`` sorted ascending — each turn's prompt grows, and the
prompt sizes of all requests still follow the file's distribution exactly. Each turn's natural
answer length is a draw from ``output_tokens``. A share ``tool_share`` of conversations carry a
tool; a turn whose answer was a tool call is followed after an agent step of 0.5–3 s by a turn
with the tool's result, any other turn after a user's think time (exponential, mean 20 s).
Every request asks ``max_tokens`` = the power of two at or above the route's p95 answer, as
clients cap answers a little above what they usually need. Whales are single-turn requests at a
flat rate, pinned to one provider (``provider.only``): load, not subjects of the experiment.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quotas.core.increments import StepPlan
from routing.core import StickyState
from simulator.model import ToolSpec, TrafficModelSpec, TrafficSpec, WhaleSpec
from simulator.switchback.loop import EventLoop

if TYPE_CHECKING:
    from simulator.switchback.route import Route

DAY = 86400.0
USER_THINK_MEAN_S = 20.0
AGENT_STEP_S = (0.5, 3.0)
TOOL = ToolSpec(
    "search",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
    },
    "Search the knowledge base.",
)
TOOLS = (TOOL,)


def diurnal_factor(t: float, amplitude: float) -> float:
    """The arrival rate relative to its mean at ``t`` seconds after local midnight."""
    return 1.0 + amplitude * math.sin(2.0 * math.pi * t / DAY - math.pi / 2.0)


def max_tokens_for(spec: TrafficModelSpec) -> int:
    """The ``max_tokens`` clients of this route ask: the power of two at or above its p95."""
    return 1 << max(0, math.ceil(math.log2(spec.output_tokens.p95)))


@dataclass(slots=True)
class Conversation:
    """One conversation: its turns' prompt and answer sizes, and where it is pinned (G12)."""

    id: str
    prompts: list[int]
    answers: list[int]
    tools: bool
    turn: int = 0
    sticky: StickyState | None = None


class SimRequest:
    """One logical request, from arrival to its end (the pipeline keeps its state here)."""

    __slots__ = (
        "arrival",
        "attempts",
        "broker_refusals",
        "candidates",
        "conversation",
        "follows_tool_result",
        "input_tokens",
        "max_tokens",
        "measured",
        "model",
        "output_tokens",
        "pinned",
        "planned",
        "provider_429",
        "slot",
        "step_plan",
        "tools",
    )

    def __init__(
        self,
        *,
        model: str,
        arrival: float,
        input_tokens: int,
        output_tokens: int,
        max_tokens: int,
        tools: bool = False,
        follows_tool_result: bool = False,
        conversation: Conversation | None = None,
        pinned: str | None = None,
    ) -> None:
        self.model = model
        self.arrival = arrival
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.max_tokens = max_tokens
        self.tools = tools
        self.follows_tool_result = follows_tool_result
        self.conversation = conversation
        self.pinned = pinned
        self.measured = False
        self.slot = -1  # the metrics slot (block × model) it counts in, if measured
        self.attempts = 0  # dispatched attempts
        self.provider_429 = 0
        self.broker_refusals = 0
        self.candidates: list[Route] = []  # endpoints not tried yet, in plan order
        # C10: its output reserved in steps (the arm's plan when it arrived), or None: the max.
        self.step_plan: StepPlan | None = None
        # The tokens the plan priced it at (in, out): what the broker's refusals tell the router.
        self.planned = (0.0, 0.0)


Sink = Callable[[SimRequest], None]


class RouteTraffic:
    """Conversation starts and follow-up turns of one route."""

    def __init__(
        self,
        spec: TrafficModelSpec,
        *,
        rng: random.Random,
        scale: float,
        origin: float,
        max_input_tokens: int,
    ) -> None:
        self.spec = spec
        self.rng = rng
        self.origin = origin  # local midnight of day 0 (the experiment's start)
        self.turns_mean = spec.conversation_turns.mean
        amplitude = spec.requests_per_minute.diurnal_amplitude
        self.amplitude = amplitude
        mean_starts = spec.requests_per_minute.mean / 60.0 / self.turns_mean * scale
        self.peak_rate = mean_starts * (1.0 + amplitude)
        inp, out = spec.input_tokens.distribution(), spec.output_tokens.distribution()
        self.input_mu, self.input_sigma = inp.mu, inp.sigma
        self.output_mu, self.output_sigma = out.mu, out.sigma
        self.max_tokens = max_tokens_for(spec)
        self.max_input_tokens = max(1, max_input_tokens)
        self.count = 0

    def next_start(self, now: float) -> float:
        """The next conversation start after ``now`` (thinning of the peak-rate process)."""
        rng, peak, amplitude = self.rng, self.peak_rate, self.amplitude
        t = now
        while True:
            t += rng.expovariate(peak)
            accept = diurnal_factor(t - self.origin, amplitude) / (1.0 + amplitude)
            if rng.random() < accept:
                return t

    def conversation(self) -> Conversation:
        rng = self.rng
        turns = 1
        if self.turns_mean > 1.0:  # geometric on 1, 2, … with the given mean
            p = 1.0 / self.turns_mean
            turns = 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
        cap = self.max_input_tokens
        prompts = sorted(
            min(cap, max(1, round(rng.lognormvariate(self.input_mu, self.input_sigma))))
            for _ in range(turns)
        )
        answers = [
            max(1, round(rng.lognormvariate(self.output_mu, self.output_sigma)))
            for _ in range(turns)
        ]
        self.count += 1
        tools = self.spec.tool_share > 0.0 and rng.random() < self.spec.tool_share
        return Conversation(f"{self.spec.name}#{self.count}", prompts, answers, tools)

    def request(self, conversation: Conversation, now: float, follows_tool: bool) -> SimRequest:
        k = conversation.turn
        return SimRequest(
            model=self.spec.name,
            arrival=now,
            input_tokens=conversation.prompts[k],
            output_tokens=conversation.answers[k],
            max_tokens=self.max_tokens,
            tools=conversation.tools,
            follows_tool_result=follows_tool,
            conversation=conversation,
        )

    def follow_up_delay(self, tool_called: bool) -> float:
        if tool_called:
            return self.rng.uniform(*AGENT_STEP_S)
        return self.rng.expovariate(1.0 / USER_THINK_MEAN_S)


class Traffic:
    """Drives every route and whale of a market's traffic on an event loop, into ``sink``."""

    def __init__(
        self,
        spec: TrafficSpec,
        *,
        loop: EventLoop,
        sink: Sink,
        rng: random.Random,
        scale: float,
        origin: float,
        until: float,
        max_input_tokens: dict[str, int],
    ) -> None:
        self.loop, self.sink, self.until = loop, sink, until
        self.routes = {
            name: RouteTraffic(
                route,
                rng=random.Random(rng.getrandbits(64)),
                scale=scale,
                origin=origin,
                max_input_tokens=max_input_tokens.get(name, 1 << 30),
            )
            for name, route in spec.models.items()
        }
        self.whales = [
            _Whale(w, self.routes[w.model], random.Random(rng.getrandbits(64)), scale, origin)
            for w in spec.whales
        ]

    def start(self) -> None:
        """Schedule the first arrival of every route and whale (from the loop's ``now``)."""
        now = self.loop.now
        for route in self.routes.values():
            self.loop.schedule(route.next_start(now), self._start_conversation, route)
        for whale in self.whales:
            first = whale.next_arrival(max(now, whale.starts_at))
            if first is not None:
                self.loop.schedule(first, self._whale_arrival, whale)

    def _start_conversation(self, route: RouteTraffic) -> None:
        now = self.loop.now
        if now >= self.until:
            return
        self.loop.schedule(route.next_start(now), self._start_conversation, route)
        self.sink(route.request(route.conversation(), now, False))

    def follow_up(self, request: SimRequest, tool_called: bool) -> None:
        """A turn ended: schedule the conversation's next turn, if it has one."""
        conversation = request.conversation
        if conversation is None or conversation.turn + 1 >= len(conversation.prompts):
            return
        conversation.turn += 1
        route = self.routes[request.model]
        at = self.loop.now + route.follow_up_delay(tool_called)
        if at < self.until:
            self.loop.schedule(at, self._turn, (route, conversation, tool_called))

    def _turn(self, args: tuple[RouteTraffic, Conversation, bool]) -> None:
        route, conversation, tool_called = args
        self.sink(route.request(conversation, self.loop.now, tool_called))

    def _whale_arrival(self, whale: _Whale) -> None:
        now = self.loop.now
        following = whale.next_arrival(now)
        if following is not None and following < self.until:
            self.loop.schedule(following, self._whale_arrival, whale)
        self.sink(whale.request(now))


class _Whale:
    def __init__(
        self, spec: WhaleSpec, route: RouteTraffic, rng: random.Random, scale: float, origin: float
    ) -> None:
        self.spec, self.route, self.rng = spec, route, rng
        self.rate = spec.requests_per_minute / 60.0 * scale
        self.starts_at = origin + spec.at
        self.ends_at = self.starts_at + spec.duration

    def next_arrival(self, now: float) -> float | None:
        t = max(now, self.starts_at) + self.rng.expovariate(self.rate)
        return t if t < self.ends_at else None

    def request(self, now: float) -> SimRequest:
        route, rng = self.route, self.rng
        prompt = round(rng.lognormvariate(route.input_mu, route.input_sigma))
        answer = round(rng.lognormvariate(route.output_mu, route.output_sigma))
        return SimRequest(
            model=route.spec.name,
            arrival=now,
            input_tokens=min(route.max_input_tokens, max(1, prompt)),
            output_tokens=max(1, answer),
            max_tokens=route.max_tokens,
            pinned=self.spec.pinned_provider,
        )
