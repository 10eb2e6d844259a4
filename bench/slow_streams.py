"""2,000 concurrent slow streams held by 2 gateway workers (issue 19's acceptance line).

    .venv/bin/python bench/slow_streams.py [--streams 2000] [--tokens-per-s 20] [--seconds 30]

Starts its own stack on loopback: an empty redis-server, the shared harness's mock upstream
(``../shared/bench-anchors/mock_upstream.py``, 2 ports × 1 process) answering every stream
with one token every 1/tokens-per-s s for ``--seconds``, and Switchyard with 2 uvicorn workers
(``bench/anchors_start.sh``: the harness's ``config-bench.yaml``, every scope with real buckets
that never bind). Then ``--clients`` processes open the streams together (spread over
``--ramp`` s), read every event to ``[DONE]`` and report what they saw. Afterwards, every
reservation must be settled: the broker's lease index (``<prefix>:leases``) and every
concurrency bucket's holders are empty. Writes ``bench/results/slow_streams.md`` (and the
figures as JSON beside it). Every process it starts is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-sy-bench-demo-key-000001"
PREFIX = "sybench"  # bench/anchors_start.sh's REDIS_PREFIX
CONFIG = "config-bench.yaml"  # the harness's: every scope has buckets, none of them binds
REDIS_FLAGS = ("--save", "", "--appendonly", "no", "--maxclients", "20000")


def harness() -> Path:
    here = ROOT.parent / "shared" / "bench-anchors"
    if here.is_dir():
        return here
    common = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--git-common-dir"])
    return (ROOT / common.decode().strip()).resolve().parent.parent / "shared" / "bench-anchors"


# -- one client process ---------------------------------------------------------------------


async def client(url: str, streams: int, ramp: float, tokens: int, timeout: float) -> dict:
    import aiohttp

    body = json.dumps(
        {
            "model": "demo-model",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": tokens + 16,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    seen: dict = {"ok": 0, "errors": {}, "events": 0, "usage_chunks": 0, "ttft": [], "total": []}

    def error(kind: str) -> None:
        seen["errors"][kind] = seen["errors"].get(kind, 0) + 1

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        await asyncio.sleep(ramp * i / streams)
        t0 = time.monotonic()
        first = None
        try:
            async with session.post(url, data=body, headers=headers) as response:
                if response.status != 200:
                    reason = response.headers.get("x-switchyard-reason", "")
                    await response.read()
                    return error(f"{response.status} {reason}")
                done = False
                async for line in response.content:
                    if not line.startswith(b"data: "):
                        continue
                    if first is None:
                        first = time.monotonic() - t0
                    seen["events"] += 1
                    if line.strip() == b"data: [DONE]":
                        done = True
                    elif b'"usage":{' in line.replace(b" ", b""):
                        seen["usage_chunks"] += 1
                if not done:
                    return error("stream ended without [DONE]")
                seen["ok"] += 1
                seen["ttft"].append(first)
                seen["total"].append(time.monotonic() - t0)
        except Exception as exc:  # every failure is counted by its kind, none stops the rest
            error(type(exc).__name__)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as session:
        await asyncio.gather(*(one(session, i) for i in range(streams)))
    return seen


# -- the stack --------------------------------------------------------------------------------


class Stack:
    def __init__(self, workdir: Path, redis_port: int, gateway_port: int) -> None:
        self.workdir, self.redis_port, self.gateway_port = workdir, redis_port, gateway_port
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], **kw) -> subprocess.Popen:
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **kw)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        # Newest first, each gone before the next: the gateway drains into a Redis still there.
        for proc in reversed(self.procs):  # uvicorn stops its own workers
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def redis(self, *args: str) -> str:
        return subprocess.check_output(
            ["redis-cli", "-p", str(self.redis_port), *args], text=True
        ).strip()


def wait_for(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not come up within {seconds:.0f} s")


def tree(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [pid, *(p for child in out.split() for p in tree(int(child)))]


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(args: argparse.Namespace) -> dict:
    bench = harness()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir, args.redis_port, args.gateway_port)
    py = sys.executable
    tokens = int(args.tokens_per_s * args.seconds)
    try:
        stack.start(
            "redis",
            ["redis-server", "--bind", "127.0.0.1", "--port", str(args.redis_port), *REDIS_FLAGS],
        )
        wait_for(lambda: stack.redis("ping") == "PONG", 10, "redis")
        for port in (18001, 18002):
            stack.start(
                f"mock-{port}",
                [
                    *(py, str(bench / "mock_upstream.py"), "--port", str(port), "--workers", "1"),
                    *("--ttft-ms", "0", "--tokens-per-s", str(args.tokens_per_s)),
                    *("--output-tokens", str(tokens)),
                ],
            )
        venv = str(Path(py).parent.parent)
        env = dict(os.environ, SWITCHYARD_SRC=str(ROOT), SWITCHYARD_VENV=venv)
        gateway = stack.start(
            "gateway",
            [
                *(str(ROOT / "bench" / "anchors_start.sh"), str(bench / "switchyard" / CONFIG)),
                *(str(args.gateway_port), "2", f"redis://127.0.0.1:{args.redis_port}/0"),
                str(workdir / "gateway"),
            ],
            env=env,
        )
        models = f"http://127.0.0.1:{args.gateway_port}/v1/models"
        probe = urllib.request.Request(models, headers={"Authorization": f"Bearer {KEY}"})
        wait_for(lambda: urllib.request.urlopen(probe, timeout=1).status == 200, 120, "gateway")
        workers = tree(gateway.pid)
        url = f"http://127.0.0.1:{args.gateway_port}/v1/chat/completions"
        per = args.streams // args.clients
        cpu0, t0 = cpu_seconds(workers), time.monotonic()
        clients = [
            subprocess.Popen(
                [py, __file__, "--client", url, *map(str, (per, args.ramp, tokens, args.timeout))],
                stdout=subprocess.PIPE,
            )
            for _ in range(args.clients)
        ]
        seen = [json.loads(c.communicate()[0]) for c in clients]
        wall, cpu = time.monotonic() - t0, cpu_seconds(workers) - cpu0
        time.sleep(2.0)  # the last settles on their way
        leases = int(stack.redis("zcard", f"{PREFIX}:leases"))
        holder_keys = stack.redis("--scan", "--pattern", f"{PREFIX}:*:h").split()
        holders = sum(int(stack.redis("zcard", k)) for k in holder_keys)
        log = (workdir / "gateway.log").read_text(errors="replace")
        rss = [peak_rss_mib(pid) for pid in workers[1:]] or [peak_rss_mib(workers[0])]
    finally:
        stack.stop()
    errors: dict[str, int] = {}
    for s in seen:
        for kind, n in s["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
    ttft = [t for s in seen for t in s["ttft"]]
    total = [t for s in seen for t in s["total"]]
    events = sum(s["events"] for s in seen)
    return {
        "streams": per * args.clients,
        "tokens_per_s": args.tokens_per_s,
        "seconds": args.seconds,
        "ok": sum(s["ok"] for s in seen),
        "errors": errors,
        "usage_chunks": sum(s["usage_chunks"] for s in seen),
        "events": events,
        "wall_s": round(wall, 1),
        "stream_s_p50": round(statistics.median(total), 2) if total else None,
        "stream_s_p99": round(pct(total, 0.99), 2),
        "ttft_ms_p50": round(1000 * statistics.median(ttft), 1) if ttft else None,
        "ttft_ms_p99": round(1000 * pct(ttft, 0.99), 1),
        "gateway_cpu_s": round(cpu, 1),
        "gateway_cpu_us_per_event": round(1e6 * cpu / events, 1) if events else None,
        "peak_rss_mib_per_worker": round(max(rss), 1),
        "leases_left": leases,
        "concurrency_holders_left": holders,
        "gateway_tracebacks": log.count("Traceback"),
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def report(r: dict) -> str:
    """The result as markdown (``--report JSON`` renders a saved one again)."""
    held = r["ok"] == r["streams"] and not r["errors"]
    settled = r["leases_left"] == 0 and r["concurrency_holders_left"] == 0
    verdict = "met" if held and settled and r["gateway_tracebacks"] == 0 else "not met"
    nominal = r["streams"] * r["tokens_per_s"]
    relayed = r["events"] / r["wall_s"]
    stretch = ""
    if r["stream_s_p50"] and r["stream_s_p50"] > 1.2 * r["seconds"]:
        stretch = (
            f"\nThe streams took longer than the upstream's {r['seconds']:g} s (p50 "
            f"{r['stream_s_p50']} s): the machine relayed {relayed:,.0f} events/s in all, where "
            f"{r['streams']:,} streams at {r['tokens_per_s']:g} tokens/s ask {nominal:,.0f}; the "
            "gateway, the mock upstream and the load generator share its 2 cores, and each "
            "waits for the others (TCP back-pressure), so the time goes to the first event and "
            "between events, not to errors.\n"
        )
    return f"""# {r["streams"]:,} concurrent slow streams on 2 workers (issue 19)

`.venv/bin/python bench/slow_streams.py` on {r["date"]}; load average at the end
{" ".join(r["loadavg"])} (2 cores; the load generator and the mock upstream share them).
Every stream: upstream {r["tokens_per_s"]:g} tokens/s for {r["seconds"]:g} s (the shared
harness's mock, `--tokens-per-s`), `stream: true` with a usage chunk, read to `[DONE]`.

**Acceptance ({verdict})**: held with no error — {r["ok"]:,} of {r["streams"]:,} streams
complete, errors {r["errors"] or "none"}, gateway tracebacks {r["gateway_tracebacks"]}; every
reservation settled — leases left {r["leases_left"]}, concurrency holders left
{r["concurrency_holders_left"]}.
{stretch}
| figure | value |
|---|---:|
| streams complete / opened | {r["ok"]:,} / {r["streams"]:,} |
| usage chunks received | {r["usage_chunks"]:,} |
| SSE events relayed | {r["events"]:,} |
| wall time of the whole run (s) | {r["wall_s"]} |
| stream duration p50 / p99 (s) | {r["stream_s_p50"]} / {r["stream_s_p99"]} |
| time to first event p50 / p99 (ms) | {r["ttft_ms_p50"]} / {r["ttft_ms_p99"]} |
| gateway CPU, both workers (s) | {r["gateway_cpu_s"]} |
| gateway CPU per relayed event (µs) | {r["gateway_cpu_us_per_event"]} |
| peak RSS per worker (MiB) | {r["peak_rss_mib_per_worker"]} |
| leases left after the run | {r["leases_left"]} |
| concurrency holders left | {r["concurrency_holders_left"]} |
"""


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        url, streams, ramp, tokens, timeout = sys.argv[2:7]
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        seen = asyncio.run(client(url, int(streams), float(ramp), int(tokens), float(timeout)))
        print(json.dumps(seen))
        return
    if sys.argv[1:2] == ["--report"]:
        print(report(json.loads(Path(sys.argv[2]).read_text())))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--tokens-per-s", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=4, help="load generator processes")
    p.add_argument("--ramp", type=float, default=10.0, help="seconds over which streams open")
    p.add_argument("--timeout", type=float, default=600.0, help="one stream's limit (s)")
    p.add_argument("--redis-port", type=int, default=16410)
    p.add_argument("--gateway-port", type=int, default=18120)
    p.add_argument("--workdir", default="/tmp/bench-slow-streams")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "slow_streams.md"))
    args = p.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = run(args)
    Path(args.out).write_text(report(result))
    Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    print(report(result))


if __name__ == "__main__":
    main()
