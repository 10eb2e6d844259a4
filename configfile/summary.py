"""What a load did: per kind, the rows created, updated or unchanged, and what pruning removed
(or, without ``--prune``, what it would remove)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import models

from configfile.prune import Removal
from quotas.models import Bucket, WorkloadClass
from routing.models import Credential, Endpoint, Model, Provider, ProviderProject
from tenants.models import ApiKey, App, Partner, Team, Tenant

CREATED, UPDATED, UNCHANGED = "created", "updated", "unchanged"
# The kinds of the summary, in the order they are applied; each is one Django model.
KINDS: dict[str, type[models.Model]] = {
    "workload class": WorkloadClass,
    "provider": Provider,
    "provider project": ProviderProject,
    "provider key": Credential,
    "model": Model,
    "endpoint": Endpoint,
    "partner": Partner,
    "tenant": Tenant,
    "team": Team,
    "app": App,
    "api key": ApiKey,
    "bucket": Bucket,
}


@dataclass
class Summary:
    """What a load did, per kind; ``secrets`` are generated key secrets, to be shown once."""

    outcomes: dict[str, dict[object, str]] = field(default_factory=dict)
    left_alone: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    secrets: list[tuple[str, str]] = field(default_factory=list)
    # With --prune, what was removed (or kept, and why); without, what --prune would remove.
    removals: list[Removal] = field(default_factory=list)
    pruned: bool = False

    def record(self, kind: str, pk: object, outcome: str) -> None:
        # An object touched twice (e.g. a model, then its fallback) keeps its strongest outcome.
        order = (UNCHANGED, UPDATED, CREATED)
        current = self.outcomes.setdefault(kind, {}).get(pk, UNCHANGED)
        self.outcomes[kind][pk] = max(current, outcome, key=order.index)

    def count(self, kind: str, outcome: str) -> int:
        return sum(1 for o in self.outcomes.get(kind, {}).values() if o == outcome)

    @property
    def changed(self) -> bool:
        upserted = any(o != UNCHANGED for kind in self.outcomes.values() for o in kind.values())
        return upserted or (self.pruned and any(r.changed for r in self.removals))

    def lines(self) -> list[str]:
        lines = []
        for kind in KINDS:
            line = (
                f"{kind}: {self.count(kind, CREATED)} created, {self.count(kind, UPDATED)} "
                f"updated, {self.count(kind, UNCHANGED)} unchanged"
            )
            if not self.pruned:
                line += f", {self.left_alone.get(kind, 0)} not in the file (left alone)"
            lines.append(line)
        return lines

    def prune_lines(self) -> list[str]:
        """With --prune, each removal; without, what is left alone that --prune would remove."""
        if self.pruned:
            return [f"pruned {removal.line()}" for removal in self.removals]
        pending = [removal for removal in self.removals if removal.changed]
        if not pending:
            return []
        return [
            f"{len(pending)} in the database and not in the file, left alone "
            "(--prune removes them):",
            *(f"  {removal.kind} {removal.label}" for removal in pending),
        ]
