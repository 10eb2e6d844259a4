"""A real Switchyard deployment on loopback, for end-to-end tests and benchmarks.

It starts what production runs — the provider simulator, the gateway under uvicorn, a Celery
worker — as separate processes on free ports, with a database and a Redis key prefix of its
own, loaded from the reference config with the simulator's ports written in. Everything it
starts is stopped by PID in ``stop()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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
# The gateway serves the files ``collectstatic`` gathered here (switchyard/settings.py STATIC_ROOT).
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
            DJANGO_SETTINGS_MODULE="switchyard.settings",
            PYTHONPATH=str(ROOT),
            PROMETHEUS_MULTIPROC_DIR=str(self.workdir / "metrics"),
            METRICS_TOKEN=SCRAPE_TOKEN,
            # The same cores whether or not this machine holds a mypyc build (gateway.serve):
            # Python, unless SWITCHYARD_TEST_CORES says otherwise for a whole run;
            # tests/e2e/test_allowances.py runs both.
            SWITCHYARD_CORES=os.environ.get("SWITCHYARD_TEST_CORES", "pure"),
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
                "gateway.serve",  # uvicorn, a listening socket per worker
                "--host",
                "127.0.0.1",
                "--port",
                str(self.gateway_port),
                "--workers",
                str(self.gateway_workers),
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
                "switchyard",
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


class RedisServer:
    """A redis-server of a test's own, which it may stop, kill and start again. Stopping saves
    its data (``SHUTDOWN SAVE``) for the next start; killing loses it (a restart empty)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self._answers, timeout=10, what="redis-server")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.5).ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        """Shut down keeping the data: the next start loads it."""
        assert self.process is not None
        with contextlib.suppress(redis.ConnectionError):  # it hangs up as it goes
            redis.Redis(port=self.port).shutdown(save=True)
        self.process.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL, data lost; remove any dump so the next start is empty."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        (self.folder / "dump.rdb").unlink(missing_ok=True)


class PostgresCluster:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl, as scripts/lib.sh starts one) that a test
    may restart or stop without disturbing the suite's own server."""

    def __init__(self) -> None:
        found = shutil.which("pg_ctl")
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        self.bin = Path(found).parent if found else (bins[-1] if bins else None)
        if self.bin is None:
            raise RuntimeError("PostgreSQL (initdb, pg_ctl) is not installed")
        self.port = free_port()
        # A folder of its own that the postgres user can reach (a test's tmp_path is not).
        self.folder = Path(tempfile.mkdtemp(prefix="sy-pg-"))
        self.folder.chmod(0o755)
        self.data = self.folder / "pg"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True)

    def init(self) -> None:
        self.data.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")
        self.start()

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w",
                  "-o", options, "start")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        """Every server process ends and every connection with it, as a failover or upgrade."""
        self.stop()
        self.start()

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


def database_url() -> tuple[str, PostgresCluster | None]:
    """``DATABASE_URL`` when it answers, else a throwaway cluster's (the caller stops it)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return url, None
        except psycopg.Error:
            pass
    cluster = PostgresCluster()
    cluster.init()
    return cluster.url, cluster
