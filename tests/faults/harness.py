"""The fault suite's deployment, load and checks (issue 13), shared by its tests and bench/faults.

Each fault gets a deployment of its own: a PostgreSQL cluster and a Redis server started for it
(so it may restart or stop them), the simulator, the gateway under uvicorn with 2 workers and a
Celery worker. An open-loop load — requests sent on a fixed schedule whatever the answers, a
third streamed, a third not, a third deferred with ``Prefer: respond-async`` — runs through the
fault. Every request names itself in ``user`` so the simulator counts its calls (``/_calls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.e2e.brokerstate import bucket_available
from tests.stack import PostgresCluster, RedisServer, Stack, wait_until

PROVIDER = "theta"
CONCURRENCY = 10
REQUESTS_PER_MINUTE = 600
LEASE_SECONDS = 5.0  # RESERVATION_LEASE_SECONDS: short, so expiry shows within the test
JOB_LEASE_SECONDS = 5.0
RATE = 3.0  # requests a second, sent whatever the answers (open loop)
LOAD_SECONDS = 24.0
FAULT_AT = 7.0  # seconds into the load
# Stated recovery: from the fault's end, requests are served again within this.
RECOVERY_BOUND_SECONDS = 10.0
# A deferred job whose run died is finished by a re-run within its job lease plus a resume
# pass and its own run (it waits its turn for capacity, like any job).
JOB_RECOVERY_BOUND_SECONDS = JOB_LEASE_SECONDS + 10.0
LEDGER_DELAY_SECONDS = 4.0  # a lookup asks for a request answered at least this long ago
INTERACTIVE_KEY = "sk-sy-test-faults-web-0001"
BACKGROUND_KEY = "sk-sy-test-faults-jobs-0001"

MARKET = {
    "providers": [
        {
            "name": PROVIDER,
            "port": 0,
            "protocol": "openai",
            # The provider enforces what the gateway is configured with: a 429 from it is a
            # request the gateway admitted over the limit.
            "limits": {"concurrency": CONCURRENCY, "requests_per_minute": REQUESTS_PER_MINUTE},
            "models": {
                "m": {
                    "ttft_ms": {"median": 100, "p95": 200},
                    "tokens_per_s": {"median": 40, "p05": 30},
                    "output_tokens": {"median": 40, "p95": 60},
                    "error_rate": 0.0,
                }
            },
        }
    ]
}
CONFIG = {
    "providers": [
        {
            "name": PROVIDER,
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": "ALPHA_API_KEY",
            "limits": [
                {"dimension": "concurrency", "capacity": CONCURRENCY},
                {"dimension": "requests", "capacity": REQUESTS_PER_MINUTE, "per": "1m"},
            ],
        }
    ],
    "models": [
        {
            "slug": "faults/m",
            "endpoints": [
                {
                    "provider": PROVIDER,
                    "upstream_model": "m",
                    "price": {"input": 1.0, "output": 1.0},
                    "context_window": 100000,
                    "max_output": 4096,
                }
            ],
        }
    ],
    "workload_classes": [
        {"name": "interactive", "deadline": "5s", "max_queue_depth": 100, "overload": "reject"},
        {"name": "background", "deadline": "5m", "max_queue_depth": 1000, "overload": "defer"},
    ],
    "tenants": [
        {
            "name": "faults",
            "teams": [
                {
                    "name": "t",
                    "apps": [
                        {
                            "name": "web",
                            "default_workload": "interactive",
                            "keys": [{"name": "k", "secret": INTERACTIVE_KEY}],
                        },
                        {
                            "name": "jobs",
                            "default_workload": "background",
                            "keys": [{"name": "k", "secret": BACKGROUND_KEY}],
                        },
                    ],
                }
            ],
        }
    ],
}


class Deployment:
    """A stack on a PostgreSQL cluster and a Redis server of its own."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.postgres = PostgresCluster()
        self.redis = RedisServer(folder)
        (folder / "market.yaml").write_text(yaml.safe_dump(MARKET))
        (folder / "switchyard.yaml").write_text(yaml.safe_dump(CONFIG))
        self.stack: Stack | None = None

    def start(self) -> Stack:
        self.postgres.init()
        self.redis.start()
        self.stack = Stack(
            database_url=self.postgres.url,
            redis_url=self.redis.url,
            market=self.folder / "market.yaml",
            config=self.folder / "switchyard.yaml",
            gateway_workers=2,
            extra_env={
                "RESERVATION_LEASE_SECONDS": str(LEASE_SECONDS),
                "LEASE_REAP_INTERVAL": "1",
                "JOB_LEASE_SECONDS": str(JOB_LEASE_SECONDS),
                "JOB_RESUME_INTERVAL": "1",
                "JOB_TRY_SECONDS": "20",
                "UPSTREAM_READ_TIMEOUT": "10",
            },
        )
        self.stack.start()
        self._wait_for_ledger()
        return self.stack

    def _wait_for_ledger(self) -> None:
        """One request through, until its ledger row is stored: the Celery worker and its beat
        are up (a load begun earlier would find the ledger queue piling up)."""
        assert self.stack is not None
        answer = httpx.post(
            f"{self.stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {INTERACTIVE_KEY}"},
            json={"model": "faults/m", "messages": [{"role": "user", "content": "up?"}]},
            timeout=30,
        )
        answer.raise_for_status()
        request_id = answer.headers["x-request-id"]
        wait_until(
            lambda: self.stack.sql("select 1 from gateway_generation where id = %s", request_id),
            timeout=60,
            what="the ledger to store a first row",
            interval=0.2,
        )

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
        self.redis.kill()
        self.postgres.destroy()


@dataclass
class Sent:
    kind: str  # stream | plain | deferred | lookup
    tag: str
    sent_at: float  # monotonic seconds since the load began
    done_at: float = 0.0
    status: int = 0  # 0: no HTTP answer (connection lost)
    complete: bool = False  # the whole answer arrived (a stream to its [DONE])
    request_id: str | None = None
    job: str | None = None  # the job's id (deferred)
    error: str = ""


@dataclass
class Load:
    sent: list[Sent] = field(default_factory=list)
    fault_started: float = 0.0
    fault_ended: float = 0.0
    fault_ended_epoch: float = 0.0


async def run_load(stack: Stack, fault, *, seconds: float = LOAD_SECONDS) -> Load:
    """Send RATE requests a second for ``seconds``; at FAULT_AT run ``fault`` (a blocking call,
    in a thread) and note when it began and ended."""
    load = Load()
    began = time.monotonic()
    kinds = ("stream", "plain", "deferred", "stream", "plain", "deferred", "lookup")

    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as http:

        async def one(n: int) -> None:
            kind = kinds[n % len(kinds)]
            sent = Sent(kind, f"faults-{n}", time.monotonic() - began)
            load.sent.append(sent)
            try:
                await _send(http, sent, load)
            except httpx.HTTPError as error:
                sent.error = repr(error)
            sent.done_at = time.monotonic() - began

        async def inject() -> None:
            await asyncio.sleep(FAULT_AT)
            load.fault_started = time.monotonic() - began
            await asyncio.to_thread(fault)
            load.fault_ended = time.monotonic() - began
            load.fault_ended_epoch = time.time()

        tasks = [asyncio.create_task(inject())]
        for n in range(int(seconds * RATE)):
            due = began + n / RATE
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            tasks.append(asyncio.create_task(one(n)))
        await asyncio.gather(*tasks)
    return load


async def _send(http: httpx.AsyncClient, sent: Sent, load: Load) -> None:
    body = {
        "model": "faults/m",
        "messages": [{"role": "user", "content": "tell me"}],
        # Streams and jobs last a few seconds, so a kill finds some in flight.
        "max_tokens": {"stream": 100, "deferred": 150}.get(sent.kind, 40),
        "user": sent.tag,
    }
    auth = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
    if sent.kind == "lookup":  # the stored record of an earlier answered request
        # Answered a while ago: the ledger stores records within a few seconds, not at once.
        settled = sent.sent_at - LEDGER_DELAY_SECONDS
        earlier = next(
            (
                s
                for s in reversed(load.sent)
                if s.kind in ("plain", "stream")
                and s.complete
                and s.request_id
                and 0 < s.done_at < settled
            ),
            None,
        )
        if earlier is None:
            sent.kind = "plain"
        else:
            answer = await http.get(
                "/v1/generation", params={"id": earlier.request_id}, headers=auth
            )
            sent.status, sent.complete = answer.status_code, True
            return
    if sent.kind == "stream":
        async with http.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=auth
        ) as answer:
            sent.status = answer.status_code
            sent.request_id = answer.headers.get("x-request-id")
            text = (await answer.aread()).decode(errors="replace")
            sent.complete = answer.status_code != 200 or text.rstrip().endswith("data: [DONE]")
        return
    headers = auth
    if sent.kind == "deferred":
        headers = {"Authorization": f"Bearer {BACKGROUND_KEY}", "Prefer": "respond-async"}
    answer = await http.post("/v1/chat/completions", json=body, headers=headers)
    sent.status, sent.complete = answer.status_code, True
    sent.request_id = answer.headers.get("x-request-id")
    if answer.status_code == 202:
        sent.job = answer.json()["id"]


def served(sent: Sent) -> bool:
    if sent.kind == "lookup" and sent.status == 404:
        return True  # not stored yet: the ledger is written off the hot path (lost rows: below)
    expected = 202 if sent.kind == "deferred" else 200
    return sent.complete and sent.status == expected


def recovery_seconds(load: Load) -> float:
    """From the fault's end until requests are served again: the send time of the first request
    served after the last one that was not (among those sent since the fault began), less the
    fault's end; 0 when every request sent after the fault's end was served."""
    since = sorted(
        (s for s in load.sent if s.sent_at >= load.fault_started), key=lambda s: s.sent_at
    )
    failed = [s.sent_at for s in since if not served(s)]
    if not failed:
        return 0.0
    after = [s.sent_at for s in since if served(s) and s.sent_at > failed[-1]]
    if not after:
        return float("inf")
    return max(0.0, after[0] - load.fault_ended)


def jobs_finished(stack: Stack, load: Load, *, timeout: float) -> dict[str, tuple]:
    """Wait until every accepted job has finished; its row: status, tries, generation id."""
    ids = [s.job for s in load.sent if s.job]
    rows: dict[str, tuple] = {}

    def done() -> bool:
        rows.clear()
        for job_id, status, tries, generation_id, finished_at in stack.sql(
            "select id, status, tries, generation_id, finished_at from gateway_job "
            "where id = any(%s)",
            ids,
        ):
            rows[job_id] = (status, tries, generation_id, finished_at)
        return len(rows) == len(ids) and all(r[0] in ("succeeded", "failed") for r in rows.values())

    with contextlib.suppress(TimeoutError):  # the checks report which did not
        wait_until(done, timeout=timeout, what="every job to finish", interval=0.5)
    return rows


def settle(stack: Stack) -> None:
    """Leases of requests that died run out and are reaped; the ledger queue drains."""
    time.sleep(LEASE_SECONDS + 2)

    def ledger_empty() -> bool:
        import redis

        client = redis.Redis.from_url(stack.redis_url)
        try:
            return client.llen(f"{stack.name}:ledger") == 0
        finally:
            client.close()

    wait_until(ledger_empty, timeout=20, what="the ledger queue to drain", interval=0.5)
    time.sleep(2)  # the last claimed batch is stored


@dataclass
class Figures:
    fault: str
    requests: int
    failed: int  # not served (any status but 200/202, or cut off)
    failed_by_status: dict[str, int]
    recovery_s: float
    recovery_bound_s: float
    over_admitted: int  # provider 429s (rate or concurrency) plus peak in flight over the limit
    peak_in_flight: int
    provider_429s: dict[str, int]
    buckets_not_full: dict[str, float]  # concurrency buckets below capacity after the lease
    ledger_rows_lost: int  # answered requests with no generation row
    jobs: int
    jobs_unfinished: int
    jobs_run_again: int  # jobs whose run died and that ran again (tries > 1)
    calls_not_in_ledger: int  # requests whose provider calls differ from their ledger attempts
    notes: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = []
        if self.over_admitted:
            found.append(f"{self.over_admitted} requests admitted over the provider's limits")
        if self.buckets_not_full:
            found.append(f"buckets not back to full after the lease: {self.buckets_not_full}")
        if self.ledger_rows_lost:
            found.append(f"{self.ledger_rows_lost} answered requests have no ledger row")
        if self.jobs_unfinished:
            found.append(f"{self.jobs_unfinished} of {self.jobs} jobs did not finish once")
        if self.calls_not_in_ledger:
            found.append(
                f"{self.calls_not_in_ledger} requests' provider calls differ from their attempts"
            )
        if not self.recovery_s <= self.recovery_bound_s:
            found.append(f"recovery took {self.recovery_s:.1f} s (bound {self.recovery_bound_s} s)")
        return found

    def write(self) -> None:
        """With FAULTS_REPORT_DIR set, keep the figures for bench/faults.py."""
        folder = os.environ.get("FAULTS_REPORT_DIR")
        if folder:
            path = Path(folder) / f"{self.fault}.json"
            path.write_text(json.dumps(asdict(self), indent=2, default=str))


def measure(stack: Stack, load: Load, fault: str, *, recovery_bound: float) -> Figures:
    jobs = jobs_finished(stack, load, timeout=JOB_RECOVERY_BOUND_SECONDS + 30)
    settle(stack)
    stats = httpx.get(f"{stack.sim_url(PROVIDER)}/_stats").json()
    calls = httpx.get(f"{stack.sim_url(PROVIDER)}/_calls").json()["by_caller"]
    rejected = {k: v for k, v in stats["rate_limited"].items()}
    over = sum(rejected.values()) + max(0, stats["peak_concurrency"] - CONCURRENCY)

    buckets = {}
    for (name,) in stack.sql("select name from quotas_bucket where dimension = 'concurrency'"):
        capacity = stack.sql("select capacity from quotas_bucket where name = %s", name)[0][0]
        available = bucket_available(stack, name)
        if available < float(capacity):
            buckets[name] = available

    # Each request's generation id: the x-request-id it was answered with, a job's own.
    generation_of = {s.tag: s.request_id for s in load.sent if s.request_id}
    for s in load.sent:
        if s.job and s.job in jobs:
            generation_of[s.tag] = jobs[s.job][2]
    ids = [g for g in generation_of.values() if g]
    stored = {
        row[0] for row in stack.sql("select id from gateway_generation where id = any(%s)", ids)
    }
    answered = [s for s in load.sent if s.complete and s.request_id and s.kind != "lookup"]
    lost = [s for s in answered if s.request_id not in stored and s.kind != "deferred"]
    # A job's answer is its generation: a finished job must have one.
    finished_jobs = [s for s in load.sent if s.job and jobs.get(s.job, ("",))[0] == "succeeded"]
    lost += [s for s in finished_jobs if jobs[s.job][2] not in stored]

    attempts = Counter(
        request_id
        for (request_id,) in stack.sql(
            "select request_id from quotas_reservation where request_id = any(%s) "
            "and outcome <> 'refused'",
            ids,
        )
    )
    mismatched = [
        tag
        for tag, generation in generation_of.items()
        if generation and calls.get(tag, 0) != attempts.get(generation, 0)
    ]
    unfinished = [s.job for s in load.sent if s.job and jobs.get(s.job, ("",))[0] != "succeeded"]

    # A job whose run died is served again when its re-run finishes.
    rerun = [r[3].timestamp() for r in jobs.values() if r[1] > 1 and r[3] is not None]
    recovery = recovery_seconds(load)
    if rerun:
        recovery = max(recovery, max(rerun) - load.fault_ended_epoch)
    failed = [s for s in load.sent if not served(s)]
    by_status = Counter(str(s.status) if s.complete else f"{s.status} cut off" for s in failed)
    figures = Figures(
        fault=fault,
        requests=len(load.sent),
        failed=len(failed),
        failed_by_status=dict(sorted(by_status.items())),
        recovery_s=round(recovery, 2),
        recovery_bound_s=recovery_bound,
        over_admitted=over,
        peak_in_flight=stats["peak_concurrency"],
        provider_429s=rejected,
        buckets_not_full=buckets,
        ledger_rows_lost=len(lost),
        jobs=len([s for s in load.sent if s.job]),
        jobs_unfinished=len(unfinished),
        jobs_run_again=len(rerun),
        calls_not_in_ledger=len(mismatched),
    )
    if unfinished:
        figures.notes.append(
            "unfinished jobs (status, tries): "
            + ", ".join(f"{j}: {jobs.get(j, ('missing',))[:2]}" for j in unfinished[:5])
        )
    if mismatched:
        figures.notes.append(
            "calls vs attempts: "
            + ", ".join(
                f"{t}: {calls.get(t, 0)} vs {attempts.get(generation_of[t], 0)}"
                for t in mismatched[:5]
            )
        )
    figures.write()
    return figures
