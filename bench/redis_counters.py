"""Redis's own counters over a measured stretch, for ``bench/redis_cost.py`` and
``bench/anchors_redis.py`` (one definition, so their figures sit side by side).

A stretch starts with ``CONFIG RESETSTAT`` and ends reading ``INFO commandstats``, ``cpu`` and
``stats``, less the harness's own commands. A command a script runs is counted in commandstats
under its own name *and* inside its EVALSHA's usec, so Redis time per request sums each
command's usec times the share of its calls a client sent (a MONITOR sample, ``sent_shares``).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

SCRIPT_CALLS = ("evalsha", "eval", "fcall")
HARNESS_COMMANDS = ("info", "config|resetstat", "config", "monitor")  # not the gateway's
MONITOR_LINE = re.compile(r'[\d.]+ \[\d+ ([^\]]*)\] "([^"]*)"')


@dataclass(frozen=True)
class Counters:
    commands: dict[str, dict[str, float]]  # name → calls, usec, usec_per_call, …
    cpu_seconds: float  # used_cpu_user + used_cpu_sys: its event loop included, an upper bound
    bytes_in: int  # total_net_input_bytes: everything the clients sent
    bytes_out: int

    @property
    def calls(self) -> float:
        """Every command's calls, those inside scripts included."""
        return sum(s["calls"] for s in self.commands.values())

    @property
    def evalsha(self) -> dict[str, float]:
        """The script calls clients sent: EVALSHA, EVAL and FCALL together (the store's
        scripts are a function library since issue 19's second round; other scripts, and
        older builds measured beside it, use EVALSHA)."""
        calls = usec = 0.0
        for name in SCRIPT_CALLS:
            s = self.commands.get(name)
            if s is not None:
                calls, usec = calls + s["calls"], usec + s["usec"]
        return {"calls": calls, "usec": usec, "usec_per_call": usec / calls if calls else 0.0}

    def client_calls(self, sent: Mapping[str, float]) -> float:
        """Calls of the commands clients sent (``sent`` as for ``client_usec``)."""
        return sum(s["calls"] * sent.get(n.split("|")[0], 1.0) for n, s in self.commands.items())

    def client_usec(self, sent: Mapping[str, float]) -> float:
        """Redis time of the commands clients sent (``sent``: see ``sent_shares``; a command
        the sample did not see counts whole)."""
        return sum(s["usec"] * sent.get(n.split("|")[0], 1.0) for n, s in self.commands.items())


class Stretch:
    """Counters from now (``CONFIG RESETSTAT``) until ``end()``."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        client.config_resetstat()
        self._cpu = _cpu_seconds(client)
        self.started = time.monotonic()
        self.seconds = 0.0  # how long it lasted, once ended

    def end(self) -> Counters:
        raw = self.client.info("commandstats")
        commands = {name.removeprefix("cmdstat_"): stats for name, stats in raw.items()}
        for own in HARNESS_COMMANDS:
            commands.pop(own, None)
        cpu = _cpu_seconds(self.client) - self._cpu
        self.seconds = time.monotonic() - self.started
        stats = self.client.info("stats")
        return Counters(
            commands, cpu, stats["total_net_input_bytes"], stats["total_net_output_bytes"]
        )


def sent_shares(port: int, out: Path, drive: Callable[[], object]) -> dict[str, float]:
    """Per command name, the share of its calls a client sent rather than a script ran, from
    ``redis-cli MONITOR`` while ``drive()`` sends a few requests."""
    with out.open("wb") as sink:
        proc = subprocess.Popen(["redis-cli", "-p", str(port), "monitor"], stdout=sink)
        time.sleep(0.3)
        drive()
        time.sleep(1.0)
        proc.terminate()
        proc.wait(timeout=10)
    seen: dict[str, list[int]] = {}
    for line in out.read_text(errors="replace").splitlines():
        m = MONITOR_LINE.match(line)
        if m:
            inner_sent = seen.setdefault(m.group(2).lower(), [0, 0])
            inner_sent[0 if m.group(1) == "lua" else 1] += 1
    return {name: sent / (inner + sent) for name, (inner, sent) in seen.items()}


def idle_cpu_rate(client: redis.Redis, seconds: float) -> float:
    """Redis's own CPU per second with no client at work (its timer events, ``hz`` times a
    second): what it costs however few requests come."""
    before = _cpu_seconds(client)
    time.sleep(seconds)
    return (_cpu_seconds(client) - before) / seconds


def lone_append_cpu(client: redis.Redis, rate: float, seconds: float) -> float:
    """Redis's CPU per round trip, its idle included, for a lone round trip of the shape of the
    ledger's append (``gateway.ledger._append``: RPUSH of one ~600-byte record and SET NX GET
    of the birth mark) ``rate`` times a second: what one answer's append costs Redis when the
    answers come one by one, so that none shares a round trip or a wake-up (I2 asks for one
    before each answer)."""
    record, key, born = b"r" * 600, "bench:lone-append", "bench:lone-append:born"

    def append(pipe: Any) -> None:
        pipe.rpush(key, record)
        pipe.set(born, "mark", nx=True, get=True)

    spent = round_trip_cpu(client, rate, seconds, append)
    client.delete(key, born)
    return spent


def round_trip_cpu(
    client: redis.Redis, rate: float, seconds: float, commands: Callable[[Any], None]
) -> float:
    """Redis's CPU per round trip, its idle included, for one pipeline of ``commands`` sent
    alone ``rate`` times a second for ``seconds``."""
    before, started, sent = _cpu_seconds(client), time.monotonic(), 0
    while time.monotonic() - started < seconds:
        pipe = client.pipeline(transaction=False)
        commands(pipe)
        pipe.execute()
        sent += 1
        time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))
    return (_cpu_seconds(client) - before) / sent


def _cpu_seconds(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
