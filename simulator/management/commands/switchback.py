"""``manage.py switchback``: the G16 switchback experiment on a simulated provider market."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common import compiled_cores as compiled
from common.reader import Invalid
from configfile import ConfigError
from configfile.schema import STREAM_RESERVATIONS
from routing.core import RoutingParameters
from routing.validation import routing_overrides
from simulator.model import MarketError
from simulator.switchback.design import NEW, OLD
from simulator.switchback.experiment import Options, Run, experiment_run
from simulator.switchback.market import SwitchbackError
from simulator.switchback.report import capacity_warning, plots_write, report_markdown

ARMS = ("routing_cost", "price_only", "price", "throughput", "latency")


class Command(BaseCommand):
    help = (
        "Run the switchback experiment (SPEC G16): the new routing-cost router and the old "
        "price-only router alternate in paired blocks on a simulated market; report the change "
        "of TTFT, throughput, 429s, errors and cost per request with bootstrap CIs over pairs."
    )
    requires_system_checks: list[str] = []  # no database: both inputs are files

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--config", required=True, type=Path, help="switchyard.yaml")
        parser.add_argument("--market", required=True, type=Path, help="market.yaml")
        parser.add_argument("--days", type=float, help="simulated days (default: traffic.duration)")
        parser.add_argument(
            "--scale", type=float, default=1.0, help="traffic and every capacity × this factor"
        )
        parser.add_argument("--json", type=Path, help="write the result JSON here")
        parser.add_argument("--plots", type=Path, help="write PNG plots into this directory")
        parser.add_argument("--report", type=Path, help="write a markdown report here")
        parser.add_argument(
            "--arms",
            default=f"{NEW},{OLD}",
            help="new,old strategies; the same twice is an A/A check (default: %(default)s)",
        )
        parser.add_argument(
            "--stream-reservation",
            metavar="NEW,OLD",
            help="how each arm's streams reserve output (C10): two of max, increments, e.g. "
            "increments,max with --arms routing_cost,routing_cost compares the two modes on "
            "the same router (default: the interactive workload class's, in both arms)",
        )
        parser.add_argument("--seed", type=int, help="override experiment.seed")
        parser.add_argument(
            "--param",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a routing parameter (routing/core/parameters.py) for every model, beneath "
            "each model's own `routing` in the config; repeatable",
        )
        parser.add_argument(
            "--segments", type=int, help="cut the run into this many parallel segments"
        )
        parser.add_argument("--workers", type=int, help="processes (default: one per segment)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.add_argument(
            "--pure",
            action="store_true",
            help="run the cores as Python (default: compiled by mypyc, built once and cached "
            f"in ${compiled.CACHE_ENV} or ~/.cache/switchyard/mypyc)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        arms = tuple(options["arms"].split(","))
        if len(arms) != 2 or any(a not in ARMS for a in arms):
            raise CommandError(f"--arms needs two of {', '.join(ARMS)}, e.g. {NEW},{OLD}")
        if options["scale"] <= 0:
            raise CommandError("--scale must be positive")
        reservation = _stream_reservation(options["stream_reservation"])
        build, which = compiled.cores(pure=options["pure"])
        self._note(which)
        run_options = Options(
            config_path=str(options["config"]),
            market_path=str(options["market"]),
            days=options["days"],
            scale=options["scale"],
            arms=(arms[0], arms[1]),
            segments=options["segments"],
            workers=options["workers"],
            seed=options["seed"],
            params=_params(options["param"]),
            compiled=build,
            stream_reservation=reservation,
        )
        bar = None if options["no_progress"] else _bar()
        try:
            run = experiment_run(run_options, progress=bar.update if bar else None)
        except (OSError, ConfigError, MarketError, SwitchbackError) as error:
            raise CommandError(str(error)) from None
        finally:
            if bar is not None:
                bar.close()
        self._write(run, options)

    def _note(self, text: str) -> None:
        self.stderr.write(f"switchback: {text}", style_func=lambda plain: plain)

    def _write(self, run: Run, options: dict[str, Any]) -> None:
        text = json.dumps(run.result, indent=2, sort_keys=True)
        if options["json"] is not None:
            options["json"].write_text(text + "\n", encoding="utf-8")
        plots: list[Path] = []
        if options["plots"] is not None:
            plots = plots_write(run, options["plots"])
        if options["report"] is not None:
            base = options["report"].parent
            relative = [str(_relative(p, base)) for p in plots]
            command = "python manage.py switchback " + " ".join(
                shlex.quote(a) for a in sys.argv[2:]
            )
            options["report"].write_text(
                report_markdown(run, command=command, plots=relative), encoding="utf-8"
            )
        overall = run.result["overall"]
        self.stdout.write(
            "overall: "
            + ", ".join(
                f"{name} {_pct(overall[name])}"
                for name in ("ttft_change", "throughput_change", "rate_limit_change", "cost_change")
            )
            + f"  ({run.requests:,} requests, {run.wall_s:.0f} s)"
        )
        for note in run.notes:
            self._note(note)
        warning = capacity_warning(run.result)
        if warning is not None:
            self._note(warning)
        if options["json"] is None:
            self.stdout.write(text)


def _stream_reservation(value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    modes = tuple(value.split(","))
    if len(modes) != 2 or any(m not in STREAM_RESERVATIONS for m in modes):
        raise CommandError(
            f"--stream-reservation needs two of {', '.join(STREAM_RESERVATIONS)}, "
            "e.g. increments,max"
        )
    return modes[0], modes[1]


def _params(pairs: list[str]) -> RoutingParameters | None:
    """``--param NAME=VALUE`` pairs on top of the deployment's ROUTING_PARAMETERS."""
    if not pairs:
        return None
    overrides: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            overrides[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise CommandError(f"--param {pair!r}: expected NAME=NUMBER")
    try:
        routing_overrides(overrides)
    except Invalid as error:
        raise CommandError(f"--param: {error}") from None
    return RoutingParameters(**{**settings.ROUTING_PARAMETERS, **overrides})


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"


def _relative(path: Path, base: Path) -> Path:
    try:
        return path.resolve().relative_to(base.resolve())
    except ValueError:
        return path


class _Bar:
    """A tqdm bar over simulated hours, fed by the experiment's progress callback."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=1.0, unit="h", desc="simulated", file=sys.stderr, leave=True, mininterval=2.0
        )
        self.total_set = False

    def update(self, done: float, total: float) -> None:
        if not self.total_set:
            self.bar.total = round(total / 3600, 1)
            self.total_set = True
        step = round(min(done, total) / 3600, 1) - self.bar.n
        if step > 0:
            self.bar.update(step)

    def close(self) -> None:
        self.bar.close()


def _bar() -> _Bar:
    return _Bar()
