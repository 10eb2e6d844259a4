"""Gateway overhead benchmark (issue 2): the simulator alone vs. through the gateway.

Starts the real stack (simulator at zero simulated latency, gateway under uvicorn with two
workers) and drives both with wrk at 1, 16 and 64 connections, non-streaming and streaming.
Writes its table at the top of bench/results/gateway.md (the file's later ``## `` sections,
written by hand or by other benchmarks, are kept) and prints it.

    DATABASE_URL=postgres://… REDIS_URL=redis://… .venv/bin/python bench/gateway_bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from quotas.core.specs import RAMP_DEFAULT_FLOOR  # noqa: E402
from tests.stack import REFERENCE_MARKET, Stack  # noqa: E402

KEY = "sk-sy-test-acme-web-0001"
CONNECTIONS = (1, 16, 64)
MESSAGES = [{"role": "user", "content": "Benchmark: say something short."}]

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
"""


def wrk(
    url: str,
    body: dict,
    key: str,
    connections: int,
    seconds: int,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """wrk's figures for ``body`` POSTed to ``url``; ``headers`` replace the bearer ``key``."""
    headers = headers if headers is not None else {"Authorization": f"Bearer {key}"}
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT.format(body=json.dumps(body)))
        script.writelines(f'wrk.headers["{name}"] = "{value}"\n' for name, value in headers.items())
    threads = 1 if connections == 1 else 2
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            script.name,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(script.name)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": _ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1)),
        "p99_ms": _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1)),
        "errors": _errors(out),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
    }


def _ms(value: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", value).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def _errors(out: str) -> int:
    errors = 0
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        errors += int(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        errors += sum(int(x) for x in m.groups())
    return errors


def unlimited_market() -> Path:
    """The reference market without enforced limits: this measures overhead, not 429s."""
    market = yaml.safe_load(REFERENCE_MARKET.read_text())
    for provider in market["providers"]:
        provider.pop("limits", None)
        provider.pop("incidents", None)
        for model in provider["models"].values():
            model.update(error_rate=0.0, overload_rate=0.0)
    path = Path(tempfile.mkdtemp(prefix="sy-bench-")) / "market.yaml"
    path.write_text(yaml.safe_dump(market, sort_keys=False))
    return path


def roomy_limits(config: dict) -> None:
    """Every configured limit kept — each request still reserves and reconciles in all of its
    buckets — but a million times larger, so the benchmark measures cost, not refusals."""
    owners = [*config.get("providers", []), *config.get("partners", [])]
    for tenant in config.get("tenants", []):
        owners.append(tenant)
        owners += [app for team in tenant.get("teams", []) for app in team.get("apps", [])]
    for owner in owners:
        for limit in owner.get("limits", []):
            if limit.get("dimension") == "ramp":
                limit.setdefault("capacity", RAMP_DEFAULT_FLOOR)  # a ramp's capacity: its floor
            if "capacity" in limit:
                limit["capacity"] *= 1_000_000
            if "factor" in limit:
                limit["factor"] = 1_000_000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
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
    rows = []
    try:
        targets = {
            "simulator alone": (
                f"{stack.sim_url('alpha')}/v1/chat/completions",
                "chat-small",
                "sim-key",
            ),
            "through the gateway": (
                f"{stack.base_url}/v1/chat/completions",
                "acme/chat-small",
                KEY,
            ),
        }
        for stream in (False, True):
            for connections in CONNECTIONS:
                for target, (url, model, key) in targets.items():
                    body = {
                        "model": model,
                        "messages": MESSAGES,
                        "max_tokens": 16,
                        "stream": stream,
                    }
                    if stream:
                        body["stream_options"] = {"include_usage": True}
                    result = wrk(url, body, key, connections, args.seconds)
                    rows.append(
                        {"target": target, "stream": stream, "connections": connections, **result}
                    )
                    print(rows[-1], flush=True)
    finally:
        stack.stop()
    report = _report(rows, args.seconds)
    path = ROOT / "bench" / "results" / "gateway.md"
    kept = ""
    if path.exists():  # the later sections (before/after notes, bench/cpu_per_request.py's)
        old = path.read_text()
        kept = old[old.index("\n## ") :] if "\n## " in old else ""
    path.write_text(report + kept)
    print(report)


def _report(rows: list[dict], seconds: int) -> str:
    lines = [
        "# Gateway overhead benchmark",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on this machine ({os.cpu_count()} cores), "
        f"`bench/gateway_bench.py --seconds {seconds}`: wrk against the provider simulator "
        "(latency scale 0, model chat-small on alpha) and against the gateway (uvicorn, 2 workers, "
        "uvloop + httptools) forwarding to the same simulator, with the broker and the router "
        "in the path (the reference config's limits, a million times larger). max_tokens 16.",
        "",
        "| mode | connections | target | requests/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mode = "streaming" if r["stream"] else "non-streaming"
        lines.append(
            f"| {mode} | {r['connections']} | {r['target']} | {r['rps']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} |"
        )
    lines += [
        "",
        "Gateway overhead at 1 connection (p50 through the gateway − p50 simulator alone):",
        "",
    ]
    for stream in (False, True):
        pair = {r["target"]: r for r in rows if r["stream"] == stream and r["connections"] == 1}
        added = pair["through the gateway"]["p50_ms"] - pair["simulator alone"]["p50_ms"]
        lines.append(f"- {'streaming' if stream else 'non-streaming'}: {added:.2f} ms")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
