"""``manage.py loadconfig FILE``: apply a Switchyard YAML configuration (DESIGN "Configuration
as data")."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from configfile import ConfigError
from configfile.apply import config_load


class Command(BaseCommand):
    help = (
        "Apply a Switchyard YAML configuration (config/switchyard.yaml shows the format): "
        "providers, models, workload classes, partners and tenants are created or updated by "
        "name. The file is validated first and applied in one transaction: if anything is "
        "invalid, nothing changes and every error is listed with its path in the file. "
        "Objects in the database that the file does not mention are left alone (and listed), "
        "unless --prune is given. With --prune the file is the source of truth for each "
        "top-level section it contains (a section it leaves out is not touched): whatever "
        "those sections manage and the file does not name is removed, including rows created "
        "in the admin. API keys are revoked, never deleted; limits and endpoints are deleted; "
        "apps, teams and tenants are deleted unless keys or ledger rows refer to them (then kept "
        "with their keys revoked, a tenant deactivated); models and providers still referred to "
        "are deactivated, partners and workload classes still referred to are kept. Learned "
        "limits are never pruned. Try --prune --dry-run first."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", help="path of the YAML file")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="validate and report what would change, then roll everything back",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="remove what the file's sections manage and the file no longer names",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path, dry_run = options["file"], options["dry_run"]
        try:
            summary = config_load(path, dry_run=dry_run, prune=options["prune"])
        except FileNotFoundError:
            raise CommandError(f"{path}: no such file") from None
        except ConfigError as error:
            listing = "\n".join(f"  {message}" for message in error.errors)
            count = len(error.errors)
            raise CommandError(
                f"{path}: {count} error{'s' if count != 1 else ''}, nothing changed:\n{listing}"
            ) from None
        for warning in summary.warnings:
            self.stderr.write(self.style.WARNING(f"warning: {warning}"))
        for line in summary.lines():
            self.stdout.write(line)
        for line in summary.prune_lines():
            self.stdout.write(self.style.NOTICE(line) if not summary.pruned else line)
        for key_path, secret in summary.secrets:
            # Generated for a new key without a literal secret: this is the only time it is shown.
            self.stdout.write(self.style.SUCCESS(f"new secret for {key_path}: {secret}"))
        if dry_run:
            self.stdout.write(self.style.NOTICE("dry run: nothing was written"))
        elif summary.changed:
            self.stdout.write(self.style.SUCCESS(f"{path}: applied"))
        else:
            self.stdout.write(f"{path}: already up to date")
