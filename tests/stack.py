"""A real Switchyard deployment on loopback, for end-to-end tests and benchmarks.

It starts what production runs — the provider simulator, the gateway under uvicorn, a Celery
worker — as separate processes on free ports, with a database and a Redis key prefix of its
own, loaded from the reference config with the simulator's ports written in. Everything it
starts is stopped by PID in ``stop()``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import redis
import yaml

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
REFERENCE_CONFIG = ROOT / "config" / "switchyard.yaml"
REFERENCE_MARKET = ROOT / "config" / "market.yaml"
# The gateway serves the files ``collectstatic`` gathered here (gateway/settings.py STATIC_ROOT).
STATIC_MANIFEST = ROOT / "var" / "static" / "staticfiles.json"
PROVIDER_KEYS = {
    "ALPHA_API_KEY": "sim-alpha",
    "BETA_API_KEY": "sim-beta",
    "GAMMA_API_KEY": "sim-gamma",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def static_collect_once() -> None:
    """Collect the static files when they never were: scripts/test collects them afresh before
    pytest; a bare ``pytest`` on a fresh clone collects them here (the admin renders their
    hashed names, and a name missing from the manifest is an error)."""
    if not STATIC_MANIFEST.exists():
        subprocess.run(
            [PYTHON, "manage.py", "collectstatic", "--noinput"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


SCRAPE_TOKEN = "scrape-token-for-tests"  # what a stack's /metrics accepts as a bearer token


@dataclass
class Stack:
    database_url: str  # any database URL of a server; the stack creates a database of its own
    redis_url: str
    market: Path = REFERENCE_MARKET
    config: Path = REFERENCE_CONFIG
    latency_scale: float = 1.0
    gateway_workers: int = 1
    celery: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    # Changes to the parsed config before it is loaded (add a model, a provider, a key…).
    config_edit: Callable[[dict[str, Any]], None] | None = None

    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    sim_ports: dict[str, int] = field(default_factory=dict)
    gateway_port: int = 0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sy-stack-")))

    def __post_init__(self) -> None:
        self.name = f"systack_{uuid.uuid4().hex[:10]}"
        self.stack_database_url = _with_database(self.database_url, self.name)
        self.maintenance_url = _with_database(self.database_url, "postgres")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def sim_url(self, provider: str) -> str:
        return f"http://127.0.0.1:{self.sim_ports[provider]}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(PROVIDER_KEYS)
        env.update(
            DATABASE_URL=self.stack_database_url,
            REDIS_URL=self.redis_url,
            REDIS_PREFIX=self.name,
            DJANGO_SETTINGS_MODULE="gateway.settings",
            PYTHONPATH=str(ROOT),
            PROMETHEUS_MULTIPROC_DIR=str(self.workdir / "metrics"),
            METRICS_TOKEN=SCRAPE_TOKEN,
        )
        env.update(self.extra_env)
        return env

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=ROOT, env=self.env(), capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
            )
        return result.stdout

    def start(self) -> Stack:
        (self.workdir / "metrics").mkdir(exist_ok=True)
        static_collect_once()
        try:
            self._start_simulator()
            self._create_database()
            self.manage("migrate", "--noinput")
            self.manage("loadconfig", str(self._config_with_ports()))
            self.manage("broker_bootstrap")
            self._start_gateway()
            if self.celery:
                self._start_celery()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def _start_simulator(self) -> None:
        ready = self.workdir / "simulator-ports.json"
        providers = [p["name"] for p in yaml.safe_load(self.market.read_text())["providers"]]
        ports = ",".join(f"{name}=0" for name in providers)
        self._spawn(
            "simulator",
            [
                PYTHON,
                "manage.py",
                "providersim",
                "--market",
                str(self.market),
                "--ports",
                ports,
                "--ready-file",
                str(ready),
                "--latency-scale",
                str(self.latency_scale),
            ],
        )
        wait_until(
            lambda: ready.exists() and ready.stat().st_size > 0,
            timeout=30,
            what=f"the simulator (log: {self.workdir / 'simulator.log'})",
        )
        self.sim_ports = json.loads(ready.read_text())

    def _config_with_ports(self) -> Path:
        config = yaml.safe_load(self.config.read_text())
        for provider in config["providers"]:
            port = self.sim_ports.get(provider["name"])
            if port is not None:  # the config's URL with the port the simulator really got
                url = urlsplit(provider["base_url"])
                provider["base_url"] = urlunsplit(url._replace(netloc=f"127.0.0.1:{port}"))
        if self.config_edit:
            self.config_edit(config)
        path = self.workdir / "switchyard.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _create_database(self) -> None:
        with psycopg.connect(self.maintenance_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')

    def _start_gateway(self) -> None:
        self.gateway_port = free_port()
        self._spawn(
            "gateway",
            [
                PYTHON,
                "-m",
                "uvicorn",
                "gateway.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.gateway_port),
                "--workers",
                str(self.gateway_workers),
                "--loop",
                "uvloop",
                "--http",
                "gateway.server:HttpProtocol",  # uvicorn's own 400s in the envelope
                "--no-access-log",
            ],
        )

        def up() -> bool:
            try:
                return httpx.get(f"{self.base_url}/v1/models", timeout=1).status_code == 401
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, what=f"the gateway (log: {self.workdir / 'gateway.log'})")

    def _start_celery(self) -> None:
        self._spawn(
            "celery",
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "gateway",
                "worker",
                "--beat",
                "--concurrency=1",
                "--loglevel=INFO",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                f"--schedule={self.workdir / 'celerybeat-schedule'}",
                "-Q",
                f"{self.name}-celery",
            ],
        )

    def sql(self, query: str, *params: object) -> list[tuple[object, ...]]:
        with psycopg.connect(self.stack_database_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()
        self._forget_redis()
        try:
            with psycopg.connect(self.maintenance_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except psycopg.Error:
            pass

    def _forget_redis(self) -> None:
        """Delete every key of this stack's prefix and of its Celery queue (they would only pile
        up otherwise). The queue is named with a '-', so ``name:*`` misses it; kombu also keeps
        its bindings (``_kombu.binding*.<queue>``) and priority lists (the queue name + suffix)."""
        queue = f"{self.name}-celery"
        try:
            client = redis.Redis.from_url(self.redis_url)
            patterns = (f"{self.name}:*", f"{queue}*", f"_kombu.binding*.{queue}")
            for pattern in patterns:
                for keys in _batched(client.scan_iter(match=pattern, count=1000), 1000):
                    client.delete(*keys)
            client.close()
        except redis.RedisError:
            pass


def _batched(items: Any, size: int) -> Any:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


def staff_client(stack: Stack) -> httpx.Client:
    """An HTTP client signed in to the stack's admin as its demo superuser."""
    password = stack.manage("demo_admin").strip()
    client = httpx.Client(base_url=stack.base_url, timeout=30)
    client.get("/admin/login/")
    client.post(
        "/admin/login/?next=/admin/",
        data={
            "username": "admin",
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{stack.base_url}/admin/login/"},
    )
    return client
