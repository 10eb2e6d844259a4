"""Front doors benchmark (issue 16): the latency each door adds, and its requests/s, next to chat.

Starts the real stack as bench/gateway_bench.py does (simulator at zero simulated latency,
gateway under uvicorn with two workers, the reference config's limits a million times larger)
and sends each door one request first: a door that answers 404 is not on this build and is
skipped (the report says so), as is one that answers anything but 200. Then wrk drives every
door, and the simulator alone as the baseline, at 1 and 16 connections, non-streaming; the
repetitions are interleaved (repetition → connections → target) so a slow spell of this shared
machine falls on every target alike, and each figure is the median over the repetitions.

Added latency is a door's p50 at 1 connection minus the p50 of the simulator alone on the
upstream call the door makes (chat completions for the three generating doors, which the
config serves from OpenAI-protocol endpoints only on acme/chat-small; embeddings for
embeddings). Writes bench/results/doors.md and prints it.

    DATABASE_URL=postgres://… REDIS_URL=redis://… .venv/bin/python -m bench.doors
"""

from __future__ import annotations

import argparse
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
from tests.stack import Stack  # noqa: E402

CONNECTIONS = (1, 16)
MODEL = "acme/chat-small"
SIM_MODEL = "chat-small"  # its upstream model on alpha
PROMPT = "Benchmark: say something short."
MESSAGES = [{"role": "user", "content": PROMPT}]
MAX_TOKENS = 16
SLOWER_BOUND = 1.15  # issue 16: no door more than 15 % slower than chat at one connection
BEARER = {"Authorization": f"Bearer {KEY}"}
ANTHROPIC = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


@dataclass
class Target:
    name: str
    path: str
    body: dict
    headers: dict[str, str]
    baseline: str | None = None  # the simulator-alone target of its upstream call
    on_simulator: bool = False
    skipped: str | None = None  # why it is not measured
    served_by: str | None = None
    runs: dict[int, list[dict]] = field(default_factory=dict)  # connections → wrk figures


def targets(embedding_model: str | None) -> list[Target]:
    embed = {"model": embedding_model, "input": PROMPT}
    sim_embed = {"model": "embedding-model", "input": PROMPT}
    return [
        Target(
            "simulator alone: chat completions",
            "/v1/chat/completions",
            {"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS},
            {"Authorization": "Bearer sim-alpha"},
            on_simulator=True,
        ),
        Target(
            "simulator alone: embeddings",
            "/v1/embeddings",
            sim_embed,
            {"Authorization": "Bearer sim-alpha"},
            on_simulator=True,
        ),
        Target(
            "/v1/chat/completions",
            "/v1/chat/completions",
            {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS},
            BEARER,
            baseline="simulator alone: chat completions",
        ),
        Target(
            "/v1/messages",
            "/v1/messages",
            {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS},
            ANTHROPIC,
            baseline="simulator alone: chat completions",
        ),
        Target(
            "/v1/responses",
            "/v1/responses",
            {"model": MODEL, "input": PROMPT, "max_output_tokens": MAX_TOKENS},
            BEARER,
            baseline="simulator alone: chat completions",
        ),
        Target(
            "/v1/embeddings",
            "/v1/embeddings",
            embed,
            BEARER,
            baseline="simulator alone: embeddings",
            skipped=None if embedding_model else "no embedding model in /v1/models",
        ),
    ]


def embedding_model_of(stack: Stack) -> str | None:
    """The first model /v1/models lists whose id says it embeds (the config names it)."""
    answer = httpx.get(f"{stack.base_url}/v1/models", headers=BEARER, timeout=10)
    ids = [m["id"] for m in answer.json().get("data", [])] if answer.status_code == 200 else []
    return next((i for i in ids if "embed" in i), None)


def probe(stack: Stack, target: Target) -> None:
    """One request: 404 means the door (or the simulator's endpoint) is not on this build."""
    if target.skipped:
        return
    url = _url(stack, target)
    if target.on_simulator and target.path == "/v1/embeddings":
        target.body["model"] = _simulator_embedding_model(stack)
    answer = httpx.post(url, json=target.body, headers=target.headers, timeout=30)
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


def _simulator_embedding_model(stack: Stack) -> str:
    answer = httpx.get(
        f"{stack.sim_url('alpha')}/v1/models", headers={"Authorization": "Bearer x"}, timeout=10
    )
    ids = [m["id"] for m in answer.json().get("data", [])]
    return next((i for i in ids if "embed" in i), "embedding-model")


def _url(stack: Stack, target: Target) -> str:
    base = stack.sim_url("alpha") if target.on_simulator else stack.base_url
    return base + target.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=3)
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
    (ROOT / "bench" / "results" / "doors.md").write_text(report)
    print(report)


def _median(target: Target, connections: int, figure: str) -> float:
    return statistics.median(run[figure] for run in target.runs[connections])


def _report(measured: list[Target], args: argparse.Namespace) -> str:
    by_name = {t.name: t for t in measured}
    lines = [
        "# Front doors benchmark",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on this machine ({os.cpu_count()} cores), "
        f"`python -m bench.doors --seconds {args.seconds} --repetitions {args.repetitions}`: "
        "wrk against each front door of the gateway (uvicorn, 2 workers; broker and router in "
        "the path, the reference config's limits a million times larger) and against the "
        "provider simulator alone (latency scale 0, alpha), non-streaming, max tokens "
        f"{MAX_TOKENS}, model {MODEL}. Repetitions interleaved; each figure is the median of "
        f"{args.repetitions} runs of {args.seconds} s.",
        "",
        "| target | served by | p50 ms, 1 conn | added ms | p99 ms, 1 conn | requests/s, 1 conn "
        "| requests/s, 16 conn | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in measured:
        if t.skipped:
            continue
        baseline = by_name.get(t.baseline) if t.baseline else None
        added = (
            f"{_median(t, 1, 'p50_ms') - _median(baseline, 1, 'p50_ms'):.2f}"
            if baseline is not None and not baseline.skipped
            else "–"
        )
        errors = sum(run["errors"] for runs in t.runs.values() for run in runs)
        lines.append(
            f"| {t.name} | {t.served_by or '–'} | {_median(t, 1, 'p50_ms'):.2f} | {added} | "
            f"{_median(t, 1, 'p99_ms'):.2f} | {_median(t, 1, 'rps'):.0f} | "
            f"{_median(t, 16, 'rps'):.0f} | {errors} |"
        )
    lines += ["", "Each door next to chat completions (door / chat):", ""]
    chat = by_name["/v1/chat/completions"]
    doors = [t for t in measured if t.baseline and t is not chat and not t.skipped]
    if not doors or chat.skipped:
        lines.append("- no other door answered on this build")
    for t in doors if not chat.skipped else []:
        latency = _median(t, 1, "p50_ms") / _median(chat, 1, "p50_ms")
        throughput = _median(t, 16, "rps") / _median(chat, 16, "rps")
        verdict = "within" if latency <= SLOWER_BOUND else "OVER"
        lines.append(
            f"- {t.name}: p50 at 1 connection ×{latency:.2f} ({verdict} the 15 % bound), "
            f"requests/s at 16 connections ×{throughput:.2f}"
        )
    skipped = [t for t in measured if t.skipped]
    if skipped:
        lines += ["", "Not measured:", ""]
        lines += [f"- {t.name}: {t.skipped}" for t in skipped]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
