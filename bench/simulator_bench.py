"""Provider simulator throughput: wrk against one provider port at latency scale 0.

Starts ``manage.py providersim`` on the reference market with its limits raised out of the way
(so every request does the full work: tokenize, admit, draw, generate, serialise) and measures
requests/s and p50/p99 latency at 1, 16 and 64 connections, for each wire protocol, plus one
streaming row. Writes ``bench/results/simulator.md``.

    .venv/bin/python bench/simulator_bench.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.launcher import running_simulator  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "simulator.md"
HUGE_LIMITS = {
    "requests_per_minute": 10**9,
    "input_tokens_per_minute": 10**12,
    "output_tokens_per_minute": 10**12,
    "concurrency": 10**6,
}
PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Summarise the quarterly report in three bullet points, please."},
]
OPENAI_BODY = {"model": "chat-small", "messages": PROMPT, "max_tokens": 256}
ANTHROPIC_BODY = {"model": "chat-large-fast", "messages": PROMPT[1:], "max_tokens": 256}
SCRIPTS = {
    "openai": ("alpha", "/v1/chat/completions", {"Authorization": "Bearer sk-bench"}, OPENAI_BODY),
    "anthropic": (
        "beta",
        "/v1/messages",
        {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01"},
        ANTHROPIC_BODY,
    ),
    "openai stream": (
        "alpha",
        "/v1/chat/completions",
        {"Authorization": "Bearer sk-bench"},
        {**OPENAI_BODY, "stream": True, "stream_options": {"include_usage": True}},
    ),
}
RUNS = [("openai", 1), ("openai", 16), ("openai", 64), ("anthropic", 1), ("anthropic", 16)]
RUNS += [("anthropic", 64), ("openai stream", 16)]


def bench_market(directory: Path) -> Path:
    market = yaml.safe_load((ROOT / "config" / "market.yaml").read_text())
    for provider in market["providers"]:
        provider.update(port=0, limits=dict(HUGE_LIMITS))
        provider.pop("incidents", None)
    path = directory / "market.yaml"
    path.write_text(yaml.safe_dump(market))
    return path


def lua_script(directory: Path, name: str) -> Path:
    _, _, headers, body = SCRIPTS[name]
    lines = ['wrk.method = "POST"', 'wrk.headers["Content-Type"] = "application/json"']
    lines += [f'wrk.headers["{key}"] = "{value}"' for key, value in headers.items()]
    lines.append(f"wrk.body = [[{json.dumps(body)}]]")
    path = directory / f"{name.replace(' ', '_')}.lua"
    path.write_text("\n".join(lines) + "\n")
    return path


def to_ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def run_wrk(url: str, script: Path, connections: int, seconds: int) -> dict[str, float]:
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script)]
    output = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", output, re.MULTILINE))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    total = re.search(r"(\d+) requests in", output)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        "p50": to_ms(latency["50"]),
        "p99": to_ms(latency["99"]),
        "requests": float(total.group(1)) if total else 0.0,
        "non_2xx": float(non_2xx.group(1)) if non_2xx else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with running_simulator(bench_market(directory), latency_scale=0.0, seed=1) as ports:
            for name, connections in RUNS:
                provider, path, _, _ = SCRIPTS[name]
                url = f"http://127.0.0.1:{ports[provider]}{path}"
                result = run_wrk(url, lua_script(directory, name), connections, args.seconds)
                rows.append((name, connections, result))
                print(
                    f"{name:14} c={connections:<3} {result['rps']:>9.0f} req/s  "
                    f"p50 {result['p50']:.2f} ms  p99 {result['p99']:.2f} ms",
                    flush=True,
                )
    write_results(rows, args.seconds, (load_before, os.getloadavg()[0]))


def write_results(
    rows: list[tuple[str, int, dict[str, float]]], seconds: int, load: tuple[float, float]
) -> None:
    lines = [
        "# Provider simulator throughput",
        "",
        f"`bench/simulator_bench.py --seconds {seconds}`, {datetime.now():%Y-%m-%d %H:%M}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}.",
        "",
        "One provider port (one process: asyncio + httptools on uvloop) at `--latency-scale 0`, "
        "reference market models with limits raised out of the way, `wrk -t1` on the same "
        "machine. Body: a system + user message, `max_tokens` 256 (the model's output-length "
        "draw, capped at 256). Non-2xx are the models' configured `error_rate` / "
        "`overload_rate` answers. The machine is shared with other work: 1-minute load "
        f"average {load[0]:.1f} before, {load[1]:.1f} after (wrk and the server each want a "
        "core), so rows vary by ±40 % between runs; the floor is what matters.",
        "",
        "| protocol | connections | requests/s | p50 ms | p99 ms | requests | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, connections, r in rows:
        lines.append(
            f"| {name} | {connections} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} "
            f"| {r['requests']:,.0f} | {r['non_2xx']:,.0f} |"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
