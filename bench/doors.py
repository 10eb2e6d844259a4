"""Front doors benchmark (issue 16): the latency each door adds, and its requests/s, next to chat.

Starts the real stack as bench/gateway_bench.py does (simulator at zero simulated latency,
gateway under uvicorn with two workers, the reference config's limits a million times larger)
and sends each target one request first: one that answers 404 is not on this build and is
skipped (the report says so), as is one answering anything but 200. Then wrk drives every
target at 1 and 16 connections; the repetitions are interleaved (repetition → connections →
target), so a slow spell of this shared machine falls on every target alike, and each figure
is the median over the repetitions.

The targets: each door on acme/chat-small (OpenAI-protocol endpoints only, so /v1/messages is
translated both ways), non-streaming and streaming; /v1/embeddings on the config's embedding
model; /v1/messages passed through to beta (Anthropic protocol) next to chat completions
translated to beta; and the simulator alone on each upstream call. Added latency is a door's
p50 at 1 connection minus the simulator's p50 on the call the door makes upstream. Writes
bench/results/doors.md and prints it.

    DATABASE_URL=postgres://… REDIS_URL=redis://… .venv/bin/python -m bench.doors
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_bench import KEY, roomy_limits, unlimited_market, wrk  # noqa: E402
from tests.stack import PROVIDER_KEYS, Stack  # noqa: E402

CONNECTIONS = (1, 16)
MODEL = "acme/chat-small"  # served by alpha and gamma, both OpenAI protocol
PASS_THROUGH_MODEL = "acme/chat-large"  # beta serves it as chat-large-fast, Anthropic protocol
PROMPT = "Benchmark: say something short."
MESSAGES = [{"role": "user", "content": PROMPT}]
MAX_TOKENS = 16
SLOWER_BOUND = 1.15  # issue 16: no door more than 15 % slower than chat at one connection
BEARER = {"Authorization": f"Bearer {KEY}"}
ANTHROPIC_VERSION = "2023-06-01"
STREAMING = " (stream)"
CHAT = "/v1/chat/completions"
SIM_CHAT = "simulator alone: alpha chat completions"
SIM_MESSAGES = "simulator alone: beta messages"
SIM_EMBEDDINGS = "simulator alone: alpha embeddings"
TO_BETA = " → beta"


@dataclass
class Target:
    name: str
    path: str
    body: dict
    headers: dict[str, str]
    baseline: str | None = None  # the simulator-alone target of the door's upstream call
    peer: str | None = None  # the chat-completions target this door is compared with
    simulator: str | None = None  # the provider port it is sent to; None: the gateway
    skipped: str | None = None  # why it is not measured
    served_by: str | None = None
    runs: dict[int, list[dict]] = field(default_factory=dict)  # connections → wrk figures


def targets(embedding_model: str | None) -> list[Target]:
    alpha_key = {"Authorization": f"Bearer {PROVIDER_KEYS['ALPHA_API_KEY']}"}
    beta_key = {"x-api-key": PROVIDER_KEYS["BETA_API_KEY"], "anthropic-version": ANTHROPIC_VERSION}
    door_key = {"x-api-key": KEY, "anthropic-version": ANTHROPIC_VERSION}
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    measured = []
    for stream in (False, True):
        suffix = STREAMING if stream else ""
        streaming = {"stream": True} if stream else {}
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        sim, peer = SIM_CHAT + suffix, CHAT + suffix
        measured += [
            Target(
                sim,
                CHAT,
                {**chat, "model": "chat-small", **streaming, **usage},
                alpha_key,
                simulator="alpha",
            ),
            Target(peer, CHAT, {**chat, **streaming, **usage}, BEARER, baseline=sim),
            Target(
                "/v1/messages" + suffix,
                "/v1/messages",
                {**chat, **streaming},
                door_key,
                baseline=sim,
                peer=peer,
            ),
            Target(
                "/v1/responses" + suffix,
                "/v1/responses",
                {"model": MODEL, "input": PROMPT, "max_output_tokens": MAX_TOKENS, **streaming},
                BEARER,
                baseline=sim,
                peer=peer,
            ),
        ]
    only_beta = {"model": PASS_THROUGH_MODEL, "provider": {"only": ["beta"]}}
    measured += [
        Target(
            SIM_EMBEDDINGS,
            "/v1/embeddings",
            {"model": "embed-small", "input": PROMPT},
            alpha_key,
            simulator="alpha",
        ),
        Target(
            "/v1/embeddings",
            "/v1/embeddings",
            {"model": embedding_model, "input": PROMPT},
            BEARER,
            baseline=SIM_EMBEDDINGS,
            peer=CHAT,
            skipped=None if embedding_model else "no embedding model in /v1/models",
        ),
        Target(
            SIM_MESSAGES,
            "/v1/messages",
            {**chat, "model": "chat-large-fast"},
            beta_key,
            simulator="beta",
        ),
        Target(CHAT + TO_BETA, CHAT, {**chat, **only_beta}, BEARER, baseline=SIM_MESSAGES),
        Target(
            "/v1/messages" + TO_BETA + " (pass-through)",
            "/v1/messages",
            {**chat, **only_beta},
            door_key,
            baseline=SIM_MESSAGES,
            peer=CHAT + TO_BETA,
        ),
    ]
    return measured


def embedding_model_of(stack: Stack) -> str | None:
    """The first model /v1/models lists whose id says it embeds (the config names it)."""
    answer = httpx.get(f"{stack.base_url}/v1/models", headers=BEARER, timeout=10)
    ids = [m["id"] for m in answer.json().get("data", [])] if answer.status_code == 200 else []
    return next((i for i in ids if "embed" in i), None)


def probe(stack: Stack, target: Target) -> None:
    """One request: 404 means the door (or the simulator's endpoint) is not on this build."""
    if target.skipped:
        return
    answer = httpx.post(_url(stack, target), json=target.body, headers=target.headers, timeout=30)
    if answer.status_code == 404:
        target.skipped = f"answers 404 on this build: {_error_message(answer)}"
    elif answer.status_code != 200:
        target.skipped = f"answers {answer.status_code}: {_error_message(answer)}"
    target.served_by = answer.headers.get("x-switchyard-provider")


def _error_message(answer: httpx.Response) -> str:
    try:
        return str(answer.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return answer.text[:160]


def _url(stack: Stack, target: Target) -> str:
    base = stack.sim_url(target.simulator) if target.simulator else stack.base_url
    return base + target.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "doors.md")
    args = parser.parse_args()
    stack = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=unlimited_market(),
        latency_scale=0.0,
        gateway_workers=2,
        celery=False,
        config_edit=roomy_limits,
    ).start()
    try:
        measured = targets(embedding_model_of(stack))
        for target in measured:
            probe(stack, target)
            print(f"{target.name}: {target.skipped or 'measured'}", flush=True)
        for repetition in range(args.repetitions):
            for connections in CONNECTIONS:
                for target in measured:
                    if target.skipped:
                        continue
                    figures = wrk(
                        _url(stack, target),
                        target.body,
                        KEY,
                        connections,
                        args.seconds,
                        headers=target.headers,
                    )
                    target.runs.setdefault(connections, []).append(figures)
                    print(repetition, connections, target.name, figures, flush=True)
    finally:
        stack.stop()
    report = _report(measured, args)
    args.output.write_text(report)
    print(report)


def _median(target: Target, connections: int, figure: str) -> float:
    return statistics.median(run[figure] for run in target.runs[connections])


def _added(target: Target, by_name: dict[str, Target]) -> float:
    """The target's p50 at 1 connection minus its upstream call's, on the simulator alone."""
    baseline = by_name[target.baseline] if target.baseline else None
    if baseline is None or baseline.skipped:
        return math.nan
    return _median(target, 1, "p50_ms") - _median(baseline, 1, "p50_ms")


def _report(measured: list[Target], args: argparse.Namespace) -> str:
    by_name = {t.name: t for t in measured}
    lines = [
        "# Front doors benchmark",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on this machine ({os.cpu_count()} cores), "
        f"`python -m bench.doors --seconds {args.seconds} --repetitions {args.repetitions}`: "
        "wrk against each front door of the gateway (uvicorn, 2 workers; broker and router in "
        "the path, the reference config's limits a million times larger) and against the "
        f"provider simulator alone (latency scale 0), max tokens {MAX_TOKENS}, model {MODEL} "
        f"unless the target says `→ beta` ({PASS_THROUGH_MODEL} with `provider.only: [beta]`). "
        f"Repetitions interleaved; each figure is the median of {args.repetitions} runs of "
        f"{args.seconds} s. Added ms: the target's p50 minus the simulator's on the call it "
        "makes upstream.",
        "",
        "| target | served by | p50 ms, 1 conn | added ms | p99 ms, 1 conn | requests/s, 1 conn "
        "| requests/s, 16 conn | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in measured:
        if t.skipped:
            continue
        added = f"{_added(t, by_name):.2f}".replace("nan", "–")
        errors = sum(run["errors"] for runs in t.runs.values() for run in runs)
        lines.append(
            f"| {t.name} | {t.served_by or '–'} | {_median(t, 1, 'p50_ms'):.2f} | {added} | "
            f"{_median(t, 1, 'p99_ms'):.2f} | {_median(t, 1, 'rps'):.0f} | "
            f"{_median(t, 16, 'rps'):.0f} | {errors} |"
        )
    lines += [
        "",
        "Each door next to its chat-completions peer (door / chat; the bound is on the added "
        "latency, which leaves out the upstream call, slower for embeddings):",
        "",
    ]
    compared = [
        (t, by_name[t.peer])
        for t in measured
        if t.peer and not t.skipped and not by_name[t.peer].skipped
    ]
    if not compared:
        lines.append("- no door but chat completions answered on this build")
    for t, chat in compared:
        latency = _median(t, 1, "p50_ms") / _median(chat, 1, "p50_ms")
        added = _added(t, by_name) / _added(chat, by_name)
        throughput = _median(t, 16, "rps") / _median(chat, 16, "rps")
        verdict = "within" if added <= SLOWER_BOUND else "OVER"
        lines.append(
            f"- {t.name} next to {chat.name}: added latency ×{added:.2f} ({verdict} the 15 % "
            f"bound), p50 ×{latency:.2f}, requests/s at 16 connections ×{throughput:.2f}"
        )
    skipped = [t for t in measured if t.skipped]
    if skipped:
        lines += ["", "Not measured:", ""]
        lines += [f"- {t.name}: {t.skipped}" for t in skipped]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
