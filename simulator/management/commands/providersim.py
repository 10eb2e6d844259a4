"""``manage.py providersim``: serve every provider of a market file on its own port and process."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from simulator.launcher import (
    LaunchError,
    parse_port_overrides,
    planned_ports,
    start_cluster,
    write_ready_file,
)
from simulator.model import MarketError, parse_market_text


class Command(BaseCommand):
    help = (
        "Serve each provider of a market file (OpenAI or Anthropic wire protocol) on 127.0.0.1, "
        "one process per provider, until SIGTERM or SIGINT."
    )
    requires_system_checks: list[str] = []  # needs no database and no other app

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--market", required=True, type=Path, help="market YAML file")
        parser.add_argument(
            "--latency-scale",
            type=float,
            default=1.0,
            help="multiply TTFT and streaming time (0: answer at once; 0.1: 10x faster)",
        )
        parser.add_argument(
            "--ports",
            default="",
            help="per-provider ports, e.g. alpha=0,beta=9202 (0: a free port)",
        )
        parser.add_argument(
            "--port-offset", type=int, default=0, help="added to the market file's ports"
        )
        parser.add_argument(
            "--ready-file", type=Path, help='write {"provider": port, ...} here once listening'
        )
        parser.add_argument("--seed", type=int, default=0, help="seed of every random draw")

    def handle(self, *args: Any, **options: Any) -> None:
        market_path: Path = options["market"]
        if options["latency_scale"] < 0:
            raise CommandError("--latency-scale must be at least 0")
        try:
            market = parse_market_text(market_path.read_text())
            ports = planned_ports(
                market, parse_port_overrides(options["ports"]), options["port_offset"]
            )
        except OSError as error:
            raise CommandError(f"cannot read {market_path}: {error.strerror}") from None
        except (MarketError, LaunchError) as error:
            raise CommandError(f"{market_path}: {error}") from None

        stop = threading.Event()
        previous = {
            signum: signal.signal(signum, lambda *_: stop.set())
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            cluster = start_cluster(
                market_path,
                market,
                ports,
                latency_scale=options["latency_scale"],
                seed=options["seed"],
            )
        except LaunchError as error:
            raise CommandError(str(error)) from None
        try:
            for provider in market.providers:
                self.stdout.write(
                    f"{provider.name}: {provider.protocol} on http://127.0.0.1:"
                    f"{cluster.ports[provider.name]}"
                )
            if options["ready_file"] is not None:
                write_ready_file(options["ready_file"], cluster.ports)
            while not stop.wait(0.5):
                exited = cluster.exited()
                if exited:
                    raise CommandError(f"provider process exited: {', '.join(exited)}")
        finally:
            cluster.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
