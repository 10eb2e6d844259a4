"""One provider on one port: routes HTTP exchanges to the behaviour model and the wire protocol.

Time: the behaviour model runs on ``clock()`` (epoch seconds). ``latency_scale`` multiplies the
planned TTFT and streaming time only (0: answer at once); limits, Retry-After and incidents stay
in real seconds, because clients act on them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from simulator.model import CompletionRequest, MarketError, Plan, ProviderBehaviour, Rejection
from simulator.model._reader import Node
from simulator.model.market import parse_incident
from simulator.server.anthropic_batches import AnthropicBatches
from simulator.server.anthropic_wire import AnthropicWire
from simulator.server.batches import BatchBook
from simulator.server.common import (
    BadRequest,
    Content,
    Headers,
    Parsed,
    Response,
    WireStream,
    make_content,
)
from simulator.server.embeddings import (
    EmbeddingsRequest,
    embeddings_body,
    embeddings_parse,
)
from simulator.server.http import Exchange
from simulator.server.openai_batches import OpenAIBatches
from simulator.server.openai_wire import OpenAIWire

TOKENS_PER_EVENT = 3  # tokens per SSE delta event: real providers send 1–4
MIN_WRITE_INTERVAL = 0.02  # seconds between stream writes: high tps must not mean one write a token
MAX_CALLERS = 100_000  # distinct callers counted by GET /_calls; later ones are not
EMBEDDINGS_PATH = "/v1/embeddings"  # OpenAI wire only: Anthropic has no embeddings API


@dataclass
class _Progress:
    """How far a paced stream got: what ``finish`` needs if the stream is cut off."""

    sent: int = 0
    finished: bool = False


class ProviderApp:
    """The request handler of one provider port (see :class:`simulator.server.http.Connection`)."""

    def __init__(
        self,
        behaviour: ProviderBehaviour,
        wire_rng: random.Random,
        *,
        latency_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.behaviour = behaviour
        self.spec = behaviour.spec
        self.wire: OpenAIWire | AnthropicWire = (
            OpenAIWire(self.spec, wire_rng)
            if self.spec.protocol == "openai"
            else AnthropicWire(self.spec, wire_rng)
        )
        self.wire_rng = wire_rng
        self.latency_scale = latency_scale
        self.clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        # Retry-After is a promise the provider makes to every client of this account: requests
        # arriving before the latest one ran out are counted, so a load test can prove that a
        # gateway honours it (requests_ignoring_retry_after stays 0).
        self._retry_after_until = 0.0
        self._ignoring_retry_after = 0
        # Calls received per caller (the body's end-user field), refused ones included: a fault
        # test tags each of its requests and checks the provider saw one call per attempt.
        self._calls: Counter[str] = Counter()
        # B2: the organisation's keys by secret (none: any key is accepted), and the revoked
        # ones (configured, or POST /_keys/revoke): answered 401 like a deleted key.
        self._keys = {k.key: k.name for k in self.spec.keys}
        self._revoked = {k.key for k in self.spec.keys if k.revoked}
        # Idempotency-Key (a gateway's deferred job sends its id): a key seen before is answered
        # with the first call's answer, not served again — as a provider that keeps keys does.
        # A non-streamed keyed request is finished even if its client hangs up, so the client's
        # retry finds the answer. GET /_idempotency counts the calls served per key and the replays.
        self._keyed: dict[str, asyncio.Future[tuple[Headers, bytes]]] = {}
        self._executions: Counter[str] = Counter()
        self._replays = 0
        # E5: the provider's batch API, when the market gives it one (else its paths are 404s).
        self.batches: OpenAIBatches | AnthropicBatches | None = None
        if self.spec.batch is not None:
            book = BatchBook(
                behaviour,
                self.wire,
                self.spec.batch,
                wire_rng,
                latency_scale=latency_scale,
                clock=clock,
            )
            self.batches = (
                OpenAIBatches(book, self.wire)
                if isinstance(self.wire, OpenAIWire)
                else AnthropicBatches(book, self.wire)
            )

    def __call__(self, exchange: Exchange) -> None:
        request = exchange.request
        method, path = request.method, request.path
        if path == self.wire.completion_path:
            if method != "POST":
                return self._send(exchange, self._method_not_allowed())
            return self._completion(exchange)
        if path == EMBEDDINGS_PATH and isinstance(self.wire, OpenAIWire):
            if method != "POST":
                return self._send(exchange, self._method_not_allowed())
            return self._embeddings(exchange)
        if path == "/v1/models" and method == "GET":
            return exchange.respond(200, self.wire.request_headers(0.0), self.wire.models())
        if path.startswith("/v1/models/") and method == "GET":
            return self._send(exchange, self.wire.model(path.removeprefix("/v1/models/")))
        if self.batches is not None and self.batches.handles(path):
            return self._batch_api(exchange)
        if path == "/_stats" and method == "GET":
            return exchange.respond(200, [], orjson.dumps(self.stats()))
        if path == "/_calls" and method == "GET":
            return exchange.respond(200, [], orjson.dumps({"by_caller": self._calls}))
        if path == "/_idempotency" and method == "GET":
            keys = {"executions": self._executions, "replays": self._replays}
            return exchange.respond(200, [], orjson.dumps(keys))
        if path == "/_reset" and method == "POST":
            self.behaviour.reset_counters()
            self._ignoring_retry_after = 0
            self._calls.clear()
            self._keyed.clear()
            self._executions.clear()
            self._replays = 0
            if self.batches is not None:
                self.batches.book.reset()
            return exchange.respond(200, [], b'{"reset": true}')
        if path == "/_incident" and method == "POST":
            return self._incident(exchange)
        if path in ("/_keys/revoke", "/_keys/restore") and method == "POST":
            return self._key_state(exchange, revoke=path.endswith("revoke"))
        if path == "/_keys" and method == "GET":
            return exchange.respond(200, [], orjson.dumps(self._key_list()))
        if path == "/_health" and method == "GET":
            return exchange.respond(200, [], b'{"ok": true}')
        self._send(exchange, self.wire.not_found(path))

    def cancel_streams(self) -> None:
        """Stop every paced stream (shutdown): each counts as a disconnect and frees its slot."""
        for task in list(self._tasks):
            task.cancel()

    def stats(self) -> dict[str, Any]:
        now = self.clock()
        behaviour = self.behaviour
        if self.batches is not None:
            self.batches.book.stats()
        return {
            "provider": self.spec.name,
            "protocol": self.spec.protocol,
            "uptime_s": round(now - behaviour.started_at, 3),
            **behaviour.stats(),
            "batch_api": (
                {"discount": self.spec.batch.discount, "turnaround_s": self.spec.batch.turnaround}
                if self.spec.batch is not None
                else None
            ),
            "requests_ignoring_retry_after": self._ignoring_retry_after,
            "limits": {
                d.dimension: {"limit": d.limit, "remaining": d.remaining, "reset_s": d.reset_s}
                for d in behaviour.limit_status(now).dimensions
            },
            "incidents": [
                {
                    "model": s.incident.model,
                    "started_s_ago": round(now - s.starts_at, 3),
                    "ends_in_s": round(s.ends_at - now, 3),
                }
                for s in behaviour.active_incidents(now)
            ],
        }

    # -- completions -------------------------------------------------------------------------

    def _completion(self, exchange: Exchange) -> None:
        now = self.clock()
        wire, request, counters = self.wire, exchange.request, self.behaviour.counters
        refused = wire.authenticate(request.headers)
        if refused is None:
            refused, key = self._key_check(request.headers)
        if refused is not None:
            counters.record_refused(refused.status, None)
            return self._send(exchange, refused)
        try:
            parsed = wire.parse(request.headers, request.body)
        except BadRequest as error:
            counters.record_refused(error.status, None)
            return self._send(exchange, wire.bad_request(error))
        self._count_call(parsed.caller, now)
        idem = None if parsed.stream else request.headers.get("idempotency-key") or None
        if idem is not None and self._replay(exchange, idem):
            return None
        outcome = self.behaviour.admit(now, parsed.request, key)
        if isinstance(outcome, Rejection):
            self._note_retry_after(outcome, now)
            return self._send(exchange, wire.rejection(outcome, parsed.request.model, now))
        plan = outcome
        headers = wire.limit_headers(plan.limits, now)
        if plan.fails_at_once:
            assert plan.failure is not None
            self.behaviour.finish(now, plan, 0)
            return self._send(exchange, wire.failure(plan.failure.status, headers))
        content = make_content(plan, self.wire_rng, wire.tool_id_prefix)
        if parsed.stream:
            self._stream(exchange, plan, content, parsed, headers, now)
        else:
            self._answer_later(exchange, plan, content, headers, now, idem)

    def _count_call(self, caller: str | None, now: float) -> None:
        if caller is not None and (caller in self._calls or len(self._calls) < MAX_CALLERS):
            self._calls[caller] += 1
        if now < self._retry_after_until:
            self._ignoring_retry_after += 1

    def _note_retry_after(self, rejection: Rejection, now: float) -> None:
        if rejection.retry_after_header is not None:
            self._retry_after_until = max(
                self._retry_after_until, now + rejection.retry_after_header
            )

    def _answer_later(
        self,
        exchange: Exchange,
        plan: Plan,
        content: Content,
        headers: Headers,
        now: float,
        key: str | None,
    ) -> None:
        self._respond_later(
            exchange, plan, headers, now, lambda at: self.wire.completion(plan, content, at), key
        )

    def _replay(self, exchange: Exchange, key: str) -> bool:
        """Answer a key seen before with its first call's answer (once that has one)."""
        first = self._keyed.get(key)
        if first is None:
            return False
        self._replays += 1

        def send(done: asyncio.Future[tuple[Headers, bytes]]) -> None:
            if done.cancelled():  # the first call failed: this one may try again
                return self._send(exchange, self.wire.failure(500, []))
            headers, body = done.result()
            exchange.respond(200, [*headers, ("idempotent-replayed", "true")], body)

        if first.done():
            send(first)
        else:
            first.add_done_callback(send)
        return True

    def _keep(self, key: str | None) -> None:
        if key is not None and (key in self._executions or len(self._executions) < MAX_CALLERS):
            self._executions[key] += 1
            self._keyed[key] = asyncio.get_running_loop().create_future()

    def _respond_later(
        self,
        exchange: Exchange,
        plan: Plan,
        headers: Headers,
        now: float,
        body: Callable[[float], bytes],
        key: str | None = None,
    ) -> None:
        """Answer ``body(now)`` once the plan's time has passed (or when it fails)."""
        self._keep(key)
        delay = plan.duration_s * self.latency_scale
        if delay <= 0:
            return self._answer(exchange, plan, headers, body, key)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(delay, self._answer, exchange, plan, headers, body, key)
        if key is not None:
            return None  # finished even if the client hangs up: its retry gets the answer

        def hung_up() -> None:
            timer.cancel()
            elapsed = (self.clock() - now) / self.latency_scale
            self.behaviour.finish(
                self.clock(), plan, plan.tokens_sent_by(elapsed), disconnected=True
            )

        exchange.on_disconnect = hung_up

    def _answer(
        self,
        exchange: Exchange,
        plan: Plan,
        headers: Headers,
        body: Callable[[float], bytes],
        key: str | None = None,
    ) -> None:
        now = self.clock()
        self.behaviour.finish(now, plan, plan.tokens_to_send)
        first = self._keyed.get(key) if key is not None else None
        if plan.failure is not None:
            if first is not None and key is not None:  # not kept: a retry is served anew
                del self._keyed[key]
                first.cancel()
            return self._send(exchange, self.wire.failure(plan.failure.status, headers))
        headers = headers + self.wire.request_headers(now - plan.admitted_at)
        answer = body(now)
        if first is not None and not first.done():
            first.set_result((headers, answer))
        exchange.respond(200, headers, answer)

    def _stream(
        self,
        exchange: Exchange,
        plan: Plan,
        content: Content,
        parsed: Parsed,
        headers: Headers,
        now: float,
    ) -> None:
        stream = self.wire.stream(plan, content, parsed, now)
        exchange.start_stream(200, headers + self.wire.request_headers(0.0))
        if self.latency_scale <= 0:  # nothing to wait for: one write, no task
            sent = plan.tokens_to_send
            body = stream.head() + stream.first_token() + stream.tokens(0, sent, TOKENS_PER_EVENT)
            self.behaviour.finish(now, plan, sent)
            return exchange.end_stream(body + self._stream_end(plan, stream))
        progress = _Progress()
        task = asyncio.get_running_loop().create_task(self._pace(exchange, plan, stream, progress))
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if not progress.finished:  # cancelled (client gone, shutdown), even before it ran
                progress.finished = True
                self.behaviour.finish(self.clock(), plan, progress.sent, disconnected=True)

        task.add_done_callback(done)

        def hung_up() -> None:
            task.cancel()

        exchange.on_disconnect = hung_up

    async def _pace(
        self, exchange: Exchange, plan: Plan, stream: WireStream, progress: _Progress
    ) -> None:
        loop = asyncio.get_running_loop()
        exchange.write(stream.head())
        await asyncio.sleep(plan.ttft_s * self.latency_scale)
        exchange.write(stream.first_token())
        started, total = loop.time(), plan.tokens_to_send
        rate = plan.tokens_per_s / self.latency_scale
        while progress.sent < total:
            due = min(total, 1 + int((loop.time() - started) * rate))
            if due > progress.sent:
                exchange.write(stream.tokens(progress.sent, due, TOKENS_PER_EVENT))
                progress.sent = due
                await exchange.drain()
            if progress.sent < total:
                next_due = started + progress.sent / rate
                await asyncio.sleep(max(MIN_WRITE_INTERVAL, next_due - loop.time()))
        progress.finished = True
        self.behaviour.finish(self.clock(), plan, progress.sent)
        exchange.end_stream(self._stream_end(plan, stream))

    def _stream_end(self, plan: Plan, stream: WireStream) -> bytes:
        if plan.failure is not None:
            return self.wire.failure_event(plan.failure.status)
        return stream.tail()

    # -- embeddings --------------------------------------------------------------------------

    def _embeddings(self, exchange: Exchange) -> None:
        """Admitted like a completion (requests, input tokens, concurrency; no output tokens),
        answered after the model's TTFT."""
        now = self.clock()
        wire, request, counters = self.wire, exchange.request, self.behaviour.counters
        assert isinstance(wire, OpenAIWire)
        refused = wire.authenticate(request.headers)
        if refused is None:
            refused, key = self._key_check(request.headers)
        if refused is not None:
            counters.record_refused(refused.status, None)
            return self._send(exchange, refused)
        try:
            parsed = embeddings_parse(request.body)
            dimensions = self._embedding_dimensions(parsed)
        except BadRequest as error:
            counters.record_refused(error.status, None)
            return self._send(exchange, wire.bad_request(error))
        self._count_call(parsed.caller, now)
        idem = request.headers.get("idempotency-key") or None
        if idem is not None and self._replay(exchange, idem):
            return None
        completion = CompletionRequest(parsed.model, parsed.input_tokens, embedding=True)
        outcome = self.behaviour.admit(now, completion, key)
        if isinstance(outcome, Rejection):
            self._note_retry_after(outcome, now)
            return self._send(exchange, wire.rejection(outcome, parsed.model, now))
        headers = wire.limit_headers(outcome.limits, now)
        if outcome.fails_at_once:
            assert outcome.failure is not None
            self.behaviour.finish(now, outcome, 0)
            return self._send(exchange, wire.failure(outcome.failure.status, headers))
        self._respond_later(
            exchange, outcome, headers, now, lambda _: embeddings_body(parsed, dimensions), idem
        )

    def _embedding_dimensions(self, parsed: EmbeddingsRequest) -> int:
        """The vectors' length; a chat model, or more dimensions than the model has, is a 400
        (an unknown model is the behaviour's 404)."""
        spec = self.spec.models.get(parsed.model)
        if spec is None:
            return 1
        native = spec.embedding_dimensions
        if native is None:
            raise BadRequest(
                f"The model `{parsed.model}` does not support embeddings.", param="model"
            )
        if parsed.dimensions is not None and parsed.dimensions > native:
            raise BadRequest(
                f"This model does not support specifying dimensions above {native}.",
                param="dimensions",
            )
        return native

    # -- the batch API (E5) -------------------------------------------------------------------

    def _batch_api(self, exchange: Exchange) -> None:
        """A batch call: authenticated as a live call is (the same keys), then the wire's."""
        request = exchange.request
        refused = self.wire.authenticate(request.headers)
        if refused is None:
            refused, _ = self._key_check(request.headers)
        if refused is not None:
            return self._send(exchange, refused)
        assert self.batches is not None
        self._send(
            exchange,
            self.batches.serve(request.method, request.path, request.headers, request.body),
        )

    # -- keys (B2) ---------------------------------------------------------------------------

    def _key_check(self, headers: dict[str, str]) -> tuple[Response | None, str | None]:
        """The name of the organisation's key a request came with, or the 401 for a key it
        does not have (revoked, unknown). Without configured keys any key is fine (None)."""
        if not self._keys:
            return None, None
        secret = self.wire.api_key(headers)
        name = self._keys.get(secret)
        if name is not None and secret not in self._revoked:
            return None, name
        self.behaviour.counters.key(name or "unknown").unauthorized += 1
        shown = f"{secret[:3]}…{secret[-4:]}" if len(secret) > 8 else "***"
        return self.wire.key_refused(shown), None

    def _key_list(self) -> dict[str, Any]:
        return {
            "keys": [{"name": k.name, "revoked": k.key in self._revoked} for k in self.spec.keys]
        }

    def _key_state(self, exchange: Exchange, *, revoke: bool) -> None:
        """``POST /_keys/revoke`` / ``/_keys/restore`` with ``{"name": …}`` or ``{"key": …}``."""
        try:
            data = orjson.loads(exchange.request.body or b"{}")
        except orjson.JSONDecodeError:
            return exchange.respond(400, [], b'{"error": "the body must be a JSON object"}')
        by_name = {k.name: k.key for k in self.spec.keys}
        wanted = data.get("key") if isinstance(data, dict) else None
        if wanted is None and isinstance(data, dict):
            wanted = by_name.get(data.get("name"))  # type: ignore[arg-type]
        if not isinstance(wanted, str) or wanted not in self._keys:
            known = ", ".join(sorted(by_name)) or "none configured"
            error = {"error": f"give the 'name' or 'key' of a configured key (known: {known})"}
            return exchange.respond(404, [], orjson.dumps(error))
        if revoke:
            self._revoked.add(wanted)
        else:
            self._revoked.discard(wanted)
        exchange.respond(200, [], orjson.dumps(self._key_list()))

    # -- control endpoints -------------------------------------------------------------------

    def _incident(self, exchange: Exchange) -> None:
        now = self.clock()
        try:
            data = orjson.loads(exchange.request.body or b"{}")
            incident = parse_incident(Node(data, "incident"), self.spec.models)
        except orjson.JSONDecodeError:
            return exchange.respond(400, [], b'{"error": "the body must be a JSON object"}')
        except MarketError as error:
            return exchange.respond(400, [], orjson.dumps({"error": str(error)}))
        scheduled = self.behaviour.start_incident(now, incident)
        body = {
            "model": incident.model,
            "starts_at": scheduled.starts_at,
            "ends_at": scheduled.ends_at,
            "overrides": {
                key: value
                for key, value in vars(incident).items()
                if key not in ("at", "duration", "model") and value is not None
            },
        }
        exchange.respond(200, [], orjson.dumps(body, default=vars))

    def _method_not_allowed(self) -> Response:
        if isinstance(self.wire, OpenAIWire):
            return self.wire.error(405, "invalid_request_error", "Method not allowed")
        return self.wire.error(405, "Method not allowed")

    def _send(self, exchange: Exchange, response: Response) -> None:
        headers = response.headers + self.wire.request_headers(0.0, response.request_id)
        exchange.respond(response.status, headers, response.body, response.content_type)
