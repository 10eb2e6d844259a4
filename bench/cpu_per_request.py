"""Gateway CPU per proxied request (issue 19 item 2): CPU seconds of the gateway's workers over
exactly N requests, against the harness's fast mock upstream and the provider simulator.

A busy machine stretches wall time, not the CPU a request costs much, so this reads the
workers' own ``utime + stime`` (``/proc/<pid>/stat``) around a fixed count of requests rather
than a rate over a timed window. Everything runs in a loopback-only network namespace (as
``bench/anchors`` does), with the ports the harness uses:

- Redis: a redis-server of its own on 16392, empty;
- upstream ``mock``: ``../shared/bench-anchors/mock_upstream.py`` on 18001 and 18002 (the
  harness's mock, run read-only from its folder); ``sim``: the provider simulator serving the
  same two accounts (``mock-a``, ``mock-b``, model ``gpt-4o-mini``) on the same ports;
- the gateway: ``bench/anchors_start.sh`` with the harness's ``config-bench.yaml`` (every
  request reserves and settles in the buckets of key, app, team, tenant and provider; nothing
  binds), uvicorn with 2 workers, no Celery; ``--server granian`` (repeatable with
  ``--server uvicorn``) starts the same application under granian instead (issue 19 item 2:
  the same checkout under both servers, interleaved); words after ``granian`` are granian's
  own options (``--server "granian --runtime-mode st"``; ``pip install granian``, which
  requirements.txt does not hold: the gateway stays on uvicorn, bench/results/gateway_cpu.md).

Cases (16 connections unless told; a warm-up of 64 requests before each; 1 s after each so a
settle on its way is counted):

- ``mock0``: the mock, TTFT 0 — what the harness's ``c16`` measures;
- ``mock500``: the mock, TTFT 500 ms (``/__mock/config``);
- ``mock0_paced``: TTFT 0, each connection waiting 0.5 s after each answer: the rate of
  ``mock500`` with nothing in flight, which tells a cost per second in flight apart from a
  cost per wall second (timers that tick whether or not a request is in flight);
- ``idle``: 10 s with no request: the workers' CPU per second with nothing to do;
- ``sim0`` / ``sim500``: the simulator at latency scale 0, and with the model answering in
  about 0.5 s (TTFT median 390 ms, 16 tokens at ~140 tokens/s, as ``bench/redis_cost.py``).

Per case it also reads the gateway's own Redis (``INFO commandstats`` / ``stats``): commands
(script-inner included), EVALSHA calls and bytes received per request, and the largest
worker's peak RSS (``VmHWM``) since it started: the harness's "peak RSS per worker"; and the
whole process tree's (the server's main process too) CPU per request and resident set at the
end, since the two servers split their work between processes differently.

    .venv/bin/python bench/cpu_per_request.py [--upstream mock|sim|both] [--reps 2]
        [--requests 2000] [--slow-requests 480] [--workers 2] [--stream] [--quick] [--fresh]
        [--src CHECKOUT --src OTHER] [--server uvicorn --server granian]
        [--py-spy DIR] [--strace DIR] [--callgrind DIR] [--json out.json]

``--src`` (repeatable) runs a gateway per checkout (a ``git worktree add --detach`` of each
commit), each with a Redis of its own, beside the same upstream, and every case on each in
turn: a before/after under the same load. ``--fresh`` restarts every gateway's workers before
each repetition: a set of workers keeps an offset of its own (±0.1 ms a request) for as long
as it runs, so without it one run compares two sets, not two checkouts. ``--py-spy DIR``
samples every worker per case (``pip install py-spy``; ``PY_SPY`` names the binary);
``--strace DIR`` counts its system calls (exact, whatever the load; the CPU of a traced case
means nothing). ``--callgrind DIR`` (one worker) runs the gateway under valgrind's callgrind and
counts the instructions it executes over each case's requests, its dumps left in DIR for
``callgrind_annotate``: on a 2-core machine shared with the load and the upstream, a 1-3 %
change in CPU time is lost in ±10 % of noise; the instruction count of the same code repeats
within ~1 % (the CPU of a case under valgrind means nothing). Prints one JSON line per case
(stderr) and a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import redis
import yaml

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
GATEWAY_PORT = 18100  # the first checkout's gateway; the next ones on 18101, …
PATH = "/v1/chat/completions"
KEY = "sk-sy-bench-demo-key-000001"  # the harness's config-bench.yaml key
MOCK_PORTS = (18001, 18002)
REDIS_PORT = 16392
TICK = os.sysconf("SC_CLK_TCK")
PY_SPY = os.environ.get("PY_SPY", "/tmp/pyspy-venv/bin/py-spy")  # pip install py-spy
CALLGRIND_DIR: Path | None = None
# the body of the harness's wrk/chat.lua, byte for byte the same request as its timed cases
MESSAGES = [
    {"role": "system", "content": "You are a concise assistant used for gateway benchmarking."},
    {
        "role": "user",
        "content": "Say hello and tell me one short fact about latency in distributed systems.",
    },
]


def harness() -> Path:
    for candidate in (ROOT.parent / "shared" / "bench-anchors", Path("/work/shared/bench-anchors")):
        if candidate.is_dir():
            return candidate
    raise SystemExit("the shared bench-anchors harness is missing")


def body(stream: bool) -> bytes:
    b: dict = {"model": "demo-model", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(b).encode()


def session(connections: int) -> aiohttp.ClientSession:
    """A client holding up to ``connections`` keep-alive connections to the gateway."""
    connector = aiohttp.TCPConnector(limit=connections)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))


async def drive(
    url: str,
    data: bytes,
    requests: int,
    connections: int,
    think: float = 0.0,
    over: aiohttp.ClientSession | None = None,
    stagger: float = 0.0,
) -> int:
    """Exactly ``requests`` POSTs, ``connections`` at a time, each connection pausing ``think``
    seconds after each answer; returns the count of non-200 answers. ``over``: a session whose
    connections to reuse (two cases over the same connections are served by the same workers),
    else a new one. ``stagger``: the connections start spread evenly over that many seconds
    rather than together, so that requests arrive spread over a cycle, not in bursts."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    left, errors = requests, 0

    async def one_connection(client: aiohttp.ClientSession, start: float) -> None:
        nonlocal left, errors
        await asyncio.sleep(start)
        while left > 0:
            left -= 1
            async with client.post(url, data=data, headers=headers) as response:
                await response.read()
                errors += response.status != 200
            if think:
                await asyncio.sleep(think)

    starts = [i * stagger / connections for i in range(connections)]
    if over is not None:
        await asyncio.gather(*(one_connection(over, start) for start in starts))
        return errors
    async with session(connections) as client:
        await asyncio.gather(*(one_connection(client, start) for start in starts))
    return errors


def children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def cpu(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """utime and stime of one process, in seconds: the kernel's share is mostly socket work
    (every loopback write runs the receiver's side of TCP too), which no Python cut reaches."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def workers(gateway: int) -> list[int]:
    """The server's worker processes: its children that run Python (not the resource tracker);
    with one worker uvicorn serves in its own process (granian forks one still)."""
    found = []
    for pid in children(gateway):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # ended since the listing (a worker being replaced by --fresh)
            continue
        # granian forks its workers: their command line is the server's (``-m granian``); a
        # checkout's path may hold the word too (this branch's worktree is wt-granian)
        server = b"granian" in cmdline.split(b"\0")
        if server or b"multiprocessing.spawn" in cmdline or b"uvicorn" in cmdline:
            found.append(pid)
    return found or [gateway]


def tree(gateway: int) -> list[int]:
    """The server's main process and every process under it."""
    pids, todo = [], [gateway]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children(pid))
    return pids


def tree_rss_mib(pids: list[int]) -> float:
    """The resident sets of the whole tree now (``VmRSS``), summed, in MiB."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def workers_cpu(pids: list[int]) -> float:
    return sum(cpu(pid) for pid in pids)


def peak_rss_mib(pids: list[int]) -> float:
    """The largest worker's peak resident set so far (``VmHWM``), in MiB: what the harness
    reports as peak RSS per worker."""
    peaks = []
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return round(max(peaks), 1)


def wait_http(url: str, *, timeout: float, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer in {timeout} s")


def set_ttft(ms: int) -> None:
    for port in MOCK_PORTS:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/__mock/config",
            data=json.dumps({"ttft_ms": ms}).encode(),
            method="POST",
        )
        urllib.request.urlopen(request, timeout=5).read()


def sim_market(folder: Path) -> Path:
    """The harness's two provider accounts, served by the simulator: gpt-4o-mini answering in
    about half a second (scaled to 0 by ``--latency-scale 0``), no limits, no errors."""
    model = {
        "ttft_ms": {"median": 390, "p95": 420},
        "tokens_per_s": {"median": 140, "p05": 120},
        "error_rate": 0.0,
        "cache_hit_rate": 0.0,
    }
    market = {
        "providers": [
            {"name": name, "port": port, "protocol": "openai", "models": {"gpt-4o-mini": model}}
            for name, port in zip(("mock-a", "mock-b"), MOCK_PORTS, strict=True)
        ]
    }
    path = folder / "market.yaml"
    path.write_text(yaml.safe_dump(market, sort_keys=False))
    return path


class Processes:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> int:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self.started.append(process)
        return process.pid

    def stop(self) -> None:
        """Each by its PID, newest first, and then whatever it started that outlived it: a
        gateway worker stuck in its shutdown when its server process was killed was left
        running, orphaned, in a network namespace of its own (seen twice, for over an hour)."""
        for process in reversed(self.started):
            family = tree(process.pid)[1:]
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for pid in family:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.started.clear()


def measure(
    url: str,
    gateway_workers: list[int],
    gateway_tree: list[int],
    *,
    case: str,
    requests: int,
    connections: int,
    stream: bool,
    think: float = 0.0,
    stagger: float = 0.0,
) -> dict:
    data = body(stream)
    asyncio.run(drive(url, data, 64, connections))  # warm: connections, scripts, snapshot
    time.sleep(1.0)
    spies = [profile(pid, f"{case}-w{n}", stream) for n, pid in enumerate(gateway_workers, 1)]
    callgrind(gateway_workers[0], "on")
    tracer = syscalls(gateway_workers[0], f"{case}-{url.rsplit(':', 1)[1].split('/')[0]}")
    redis_port = REDIS_PORT + int(url.rsplit(":", 1)[1].split("/")[0]) - GATEWAY_PORT
    redis_before = redis_counts(redis_port)
    tree_before = workers_cpu(gateway_tree)
    system_before = sum(cpu_split(pid)[1] for pid in gateway_workers)
    before, started = workers_cpu(gateway_workers), time.monotonic()
    errors = asyncio.run(drive(url, data, requests, connections, think, stagger=stagger))
    seconds = time.monotonic() - started
    instructions = callgrind(gateway_workers[0], "off")
    for watcher in (*spies, tracer):
        if watcher is not None:
            watcher.send_signal(signal.SIGINT)  # py-spy and strace write their report on SIGINT
            watcher.wait(timeout=30)
    time.sleep(1.0)  # a settle still on its way
    spent = workers_cpu(gateway_workers) - before
    system = sum(cpu_split(pid)[1] for pid in gateway_workers) - system_before
    tree_spent = workers_cpu(gateway_tree) - tree_before
    redis_after = redis_counts(redis_port)
    return {
        "case": case,
        "stream": stream,
        "requests": requests,
        "connections": connections,
        "errors": errors,
        "seconds": round(seconds, 2),
        "rps": round(requests / seconds, 1),
        "cpu_ms_per_req": round(spent * 1000 / requests, 3),
        "cpu_system_ms_per_req": round(system * 1000 / requests, 3),
        "loadavg": Path("/proc/loadavg").read_text().split()[0],
        **({"instructions_per_req": round(instructions / requests)} if instructions else {}),
        "peak_rss_mib": peak_rss_mib(gateway_workers),  # since the worker started
        "tree_cpu_ms_per_req": round(tree_spent * 1000 / requests, 3),
        "tree_rss_mib": tree_rss_mib(gateway_tree),
        # the gateway's own Redis: every command (those a script runs included) and the
        # round trips' bytes, per request; the 1 s after the requests included
        **{
            f"redis_{name}_per_req": round((redis_after[name] - redis_before[name]) / requests, 2)
            for name in redis_before
        },
    }


def redis_counts(port: int) -> dict[str, int]:
    """Commands run (script-inner ones included, less this reading's own), script calls,
    round trips (the server's read events, one a pipeline; the readings' own few included, ~0.01
    a request), bytes received; and the server's CPU (µs, its idle included: each gateway has a
    Redis of its own)."""
    client = redis.Redis(port=port)
    try:
        stats = client.info("commandstats")
        net = client.info("stats")
        cpu = client.info("cpu")
    finally:
        client.close()
    calls = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
    return {
        "commands": calls,
        "evalsha": stats.get("cmdstat_evalsha", {}).get("calls", 0),
        "fcall": stats.get("cmdstat_fcall", {}).get("calls", 0),
        "round_trips": net["total_reads_processed"],
        "bytes_in": net["total_net_input_bytes"],
        "cpu_us": round((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6),
    }


PROFILE_DIR: Path | None = None


def profile(pid: int, case: str, stream: bool) -> subprocess.Popen[bytes] | None:
    """With ``--py-spy DIR``: sample a worker through the case (``--nonblocking``: the worker
    is not paused, so its CPU figure moves little) into DIR/<case>.txt, collapsed stacks.
    Every worker is sampled (``<case>-w1``, ``-w2`` …): one of them may accept every
    connection and the other see no request."""
    if PROFILE_DIR is None:
        return None
    out = PROFILE_DIR / f"{case}{'-stream' if stream else ''}.txt"
    return subprocess.Popen(
        [PY_SPY, "record", "--nonblocking", "--format", "raw", "--rate", "200", "-p", str(pid),
         *os.environ.get("PY_SPY_ARGS", "").split(),
         "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def callgrind(pid: int, switch: str) -> int:
    """With ``--callgrind DIR``: the worker's instrumentation turned on, or off and what it
    counted since dumped (``callgrind_control``): the instructions executed, else 0."""
    if CALLGRIND_DIR is None:
        return 0
    subprocess.run(["callgrind_control", "-i", switch, str(pid)], check=True, capture_output=True)
    if switch == "on":
        return 0
    dumps = set(CALLGRIND_DIR.glob(f"callgrind.{pid}.*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    (dump,) = set(CALLGRIND_DIR.glob(f"callgrind.{pid}.*")) - dumps
    totals = next(line for line in dump.read_text().splitlines() if line.startswith("totals:"))
    return int(totals.split()[1])


STRACE_DIR: Path | None = None


def syscalls(pid: int, name: str) -> subprocess.Popen[bytes] | None:
    """With ``--strace DIR``: count one worker's system calls through the case (``strace -c``,
    its threads too) into DIR/<name>.txt. Exact counts (sends, receives, epoll waits per
    request) whatever the load; the CPU figure of a traced case is not comparable."""
    if STRACE_DIR is None:
        return None
    out = STRACE_DIR / f"{name}.txt"
    return subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def idle(gateway_workers: list[int], seconds: float) -> dict:
    spy = profile(gateway_workers[0], "idle", False)
    before = workers_cpu(gateway_workers)
    time.sleep(seconds)
    spent = workers_cpu(gateway_workers) - before
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=30)
    return {"case": "idle", "cpu_ms_per_s": round(spent * 1000 / seconds, 2)}


def run_stack(upstream: str, args: argparse.Namespace, folder: Path) -> list[dict]:
    """One upstream, and a gateway (with a Redis of its own) per checkout in ``args.src``, all
    up together: each case runs on every gateway in turn, repetition after repetition, so a
    before/after comparison sees the same machine load."""
    procs = Processes(folder)
    rows: list[dict] = []
    try:
        if upstream == "mock":
            for port in MOCK_PORTS:
                procs.spawn(
                    f"mock-{port}",
                    [PYTHON, str(harness() / "mock_upstream.py"), "--port", str(port)],
                )
        else:
            procs.spawn(
                "simulator",
                [PYTHON, "manage.py", "providersim", "--market", str(sim_market(folder)),
                 "--latency-scale", str(args.scale)],
                env={"DJANGO_SETTINGS_MODULE": "switchyard.settings",
                     "DATABASE_URL": f"sqlite:///{folder}/sim.sqlite3"},
            )  # fmt: skip
        for port in MOCK_PORTS:
            wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=60)
        gateways: list[tuple[str, str, list[int], list[int]]] = []  # label, URL, workers, tree
        mains: list[int] = []  # each gateway's server process
        for n, (src, server) in enumerate(
            (src, server) for src in args.src for server in args.server
        ):
            redis_port, port = REDIS_PORT + n, GATEWAY_PORT + n
            procs.spawn(
                f"redis-{n}",
                ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--save", ""],
            )
            gateway = procs.spawn(
                f"gateway-{n}",
                [str(ROOT / "bench" / "anchors_start.sh"),
                 str(harness() / "switchyard" / "config-bench.yaml"), str(port), str(args.workers),
                 f"redis://127.0.0.1:{redis_port}/0", str(folder / f"gateway-{n}")],
                env={"SWITCHYARD_SRC": str(src), "SWITCHYARD_VENV": str(ROOT / ".venv"),
                     "SWITCHYARD_SERVER": server.split()[0],
                     "GRANIAN_ARGS": " ".join(server.split()[1:]),
                     "SWITCHYARD_WRAP": valgrind()},
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=300 if CALLGRIND_DIR else 120)
            pids = workers(gateway)
            assert len(pids) == args.workers, f"expected {args.workers} workers, found {pids}"
            label = source_label(src) + ("" if args.server == ["uvicorn"] else f" {server}")
            if label.endswith("+changes"):  # scratch copies of one commit: which is which
                label += f" ({src.name})"
            gateways.append((label, f"http://127.0.0.1:{port}{PATH}", pids, tree(gateway)))
            mains.append(gateway)

        def each(case: str, requests: int, think: float = 0.0) -> None:
            for label, url, pids, all_pids in gateways:
                row = measure(
                    url, pids, all_pids, case=case, requests=requests, think=think,
                    connections=args.connections, stream=args.stream,
                    stagger=0.0 if case == "mock0" else args.stagger,
                )  # fmt: skip
                rows.append({"src": label, **row})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

        for rep in range(args.reps):
            if args.fresh and rep:
                for n, gateway in enumerate(mains):
                    gateways[n] = fresh_workers(gateways[n], gateway, args.workers)
            if upstream == "mock":
                set_ttft(0)
                each("mock0", args.requests)
                if args.quick:
                    continue
                set_ttft(500)
                each("mock500", args.slow_requests)
                set_ttft(0)
                each("mock0_paced", args.slow_requests, think=0.5)
                for label, _, pids, _ in gateways:
                    rows.append({"src": label, **idle(pids, args.idle_seconds)})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            elif args.scale == 0:
                each("sim0", args.requests)
            else:
                each("sim500", args.slow_requests)
    finally:
        procs.stop()
    return rows


def valgrind() -> str:
    """The command each gateway runs under with ``--callgrind``: callgrind, counting nothing
    until told (start-up and warm-up run at valgrind's uninstrumented speed)."""
    if CALLGRIND_DIR is None:
        return ""
    out = CALLGRIND_DIR / "callgrind.%p"
    return f"valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file={out}"


def fresh_workers(
    entry: tuple[str, str, list[int], list[int]], gateway: int, count: int
) -> tuple[str, str, list[int], list[int]]:
    """``--fresh``: the gateway's workers restarted (its runner, ``gateway.serve``, replaces
    them all on SIGHUP) and their new PIDs. One set of workers keeps its own offset for a
    whole run: which worker accepted the connections, its hash seed and heap layout. Two
    checkouts' CPU per request differed by 0.1-0.16 ms in one direction, then in the other,
    with the same code on both sides (bench/results/gateway_cpu.md); new workers for every
    repetition turn that offset into noise the repetitions average out."""
    label, url, old, _ = entry
    os.kill(gateway, signal.SIGHUP)
    deadline = time.monotonic() + 120
    while True:
        pids = [pid for pid in workers(gateway) if pid not in old]
        gone = not any(Path(f"/proc/{pid}").exists() for pid in old)
        if len(pids) == count and gone:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: workers not restarted, found {pids}")
        time.sleep(0.2)
    wait_http(url.split("/v1/")[0] + "/v1/models", timeout=120)
    return label, url, pids, tree(gateway)


def source_label(src: Path) -> str:
    """The checkout's commit, and whether its work tree differs from it."""
    head = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+changes" if dirty else "")


def inside(args: argparse.Namespace) -> None:
    """Runs in the namespace: each stack in turn, rows as JSON on the last line."""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sy-cpu-") as tmp:
        folder = Path(tmp)
        if args.upstream in ("mock", "both"):
            rows += run_stack("mock", args, folder)
        if args.upstream in ("sim", "both"):
            for scale in (0.0, 1.0):
                args.scale = scale
                rows += run_stack("sim", args, folder)
    print("ROWS " + json.dumps(rows), flush=True)


def mean(rows: list[dict], name: str) -> float:
    values = [r[name] for r in rows if name in r]
    return sum(values) / len(values) if values else float("nan")


def table(rows: list[dict]) -> str:
    lines = [
        "| case | checkout | requests | errors | req/s | gateway CPU ms / req (each rep) | mean "
        "| Redis commands / req | FCALL / req | round trips / req | Redis CPU µs / req (each rep) "
        "| bytes to Redis / req | peak RSS per worker MiB | whole tree: CPU ms / req, RSS MiB "
        "| loadavg |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["case"], row["src"]), []).append(row)
    for (case, src), group in groups.items():
        if case == "idle":
            values = [r["cpu_ms_per_s"] for r in group]
            lines.append(
                f"| idle (CPU ms / s, all workers) | {src} | | | | "
                f"{' / '.join(f'{v:.2f}' for v in values)} | {sum(values) / len(values):.2f} "
                "| | | | | | | | |"
            )
            continue
        values = [r["cpu_ms_per_req"] for r in group]
        if "instructions_per_req" in group[0]:  # under valgrind: the CPU figures mean nothing
            counts = [r["instructions_per_req"] / 1000 for r in group]
            values = [r["instructions_per_req"] / 1e6 for r in group]
            lines.append(
                f"| {case} (million instructions / req) | {src} | {group[0]['requests']} "
                f"| {sum(r['errors'] for r in group)} | | "
                f"{' / '.join(f'{v:,.0f}k' for v in counts)} | {sum(values) / len(values):.3f} "
                "| | | | | | | | |"
            )
            continue
        lines.append(
            f"| {case}{' stream' if group[0]['stream'] else ''} | {src} | {group[0]['requests']} "
            f"| {sum(r['errors'] for r in group)} | "
            f"{sum(r['rps'] for r in group) / len(group):.0f} | "
            f"{' / '.join(f'{v:.3f}' for v in values)} | {sum(values) / len(values):.3f} | "
            f"{mean(group, 'redis_commands_per_req'):.1f} | "
            f"{mean(group, 'redis_fcall_per_req'):.3f} | "
            f"{mean(group, 'redis_round_trips_per_req'):.3f} | "
            f"{' / '.join(str(round(r.get('redis_cpu_us_per_req', 0))) for r in group)} | "
            f"{mean(group, 'redis_bytes_in_per_req'):,.0f} | "
            f"{max(r.get('peak_rss_mib', 0) for r in group):.1f} | "
            f"{mean(group, 'tree_cpu_ms_per_req'):.3f}, "
            f"{max(r.get('tree_rss_mib', 0) for r in group):.1f} | "
            f"{' / '.join(r['loadavg'] for r in group)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", choices=("mock", "sim", "both"), default="mock")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--slow-requests", type=int, default=480)
    parser.add_argument(
        "--stagger", type=float, default=0.0,
        help="mock500 and mock0_paced: the connections' first requests spread over this many "
        "seconds (0.5: one by one, as bench/anchors_redis.py's pairs)",
    )  # fmt: skip
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--py-spy", type=Path, help="profile every worker of each case into DIR")
    parser.add_argument("--strace", type=Path, help="count worker 1's syscalls into DIR")
    parser.add_argument(
        "--callgrind", type=Path, help="count the instructions of each case (1 worker) into DIR"
    )
    parser.add_argument(
        "--src",
        type=Path,
        action="append",
        help="a checkout whose gateway runs (default: this one); give several to compare them "
        "side by side under the same load",
    )
    parser.add_argument(
        "--server",
        action="append",
        help="the HTTP server each checkout's gateway runs under: uvicorn (the default) or "
        "granian, with granian's options after it; give several to compare them side by side "
        "(bench/anchors_start.sh's SWITCHYARD_SERVER and GRANIAN_ARGS)",
    )
    parser.add_argument("--quick", action="store_true", help="mock: only the mock0 case")
    parser.add_argument(
        "--fresh", action="store_true", help="restart the workers before each repetition"
    )
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.src = args.src or [ROOT]
    args.server = args.server or ["uvicorn"]
    if args.callgrind and (args.workers != 1 or args.server != ["uvicorn"]):
        parser.error("--callgrind runs one uvicorn worker under valgrind: --workers 1")
    if args.fresh and (args.workers < 2 or args.server != ["uvicorn"]):
        parser.error("--fresh restarts the workers of gateway.serve's supervisor: 2 or more")
    for server in args.server:
        if server.split() != ["uvicorn"] and server.split()[:1] != ["granian"]:
            parser.error(f"--server {server!r}: uvicorn, or granian and its options")
    if args.inside:
        global PROFILE_DIR, STRACE_DIR, CALLGRIND_DIR
        PROFILE_DIR, STRACE_DIR, CALLGRIND_DIR = args.py_spy, args.strace, args.callgrind
        if CALLGRIND_DIR is not None:
            CALLGRIND_DIR = CALLGRIND_DIR.resolve()
            CALLGRIND_DIR.mkdir(parents=True, exist_ok=True)
        inside(args)
        return
    started = Path("/proc/loadavg").read_text().strip()
    command = [sys.executable, __file__, "--inside", *sys.argv[1:]]
    out = subprocess.run(
        # A private /dev/shm too: the mock keeps its runtime config (the TTFT) in
        # /dev/shm/mock_upstream_<port>.cfg, which another run on the same ports in another
        # namespace (this bench, bench/anchors) would otherwise share and change mid-case.
        [
            "unshare",
            "-n",
            "-m",
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            'ip link set lo up && mount -t tmpfs tmpfs /dev/shm && exec "$@"',
            "-",
            *command,
        ],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    rows = json.loads(next(line for line in out.splitlines() if line.startswith("ROWS "))[5:])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"loadavg at start: {started}\nloadavg at end: {Path('/proc/loadavg').read_text()}")
    print(table(rows))


if __name__ == "__main__":
    main()
