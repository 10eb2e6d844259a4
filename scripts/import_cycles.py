#!/usr/bin/env python
"""Counts import cycles in the project with grimp (the graph under import-linter).

Two counts: cycles between top-level packages (each package squashed to one node), and cycles
among the modules inside one top-level package. Each count is the number of strongly connected
groups of more than one node; every import is counted, those inside functions and under
TYPE_CHECKING too. Prints each group with its members and exits 1 when either count is not 0.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    "switchyard",
    "simulator",
    "bench",
    "ops",
    "configfile",
    "gateway",
    "quotas",
    "routing",
    "tenants",
    "common",
]


def strongly_connected(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's groups of more than one node (iterative: the module graph is deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def report(title: str, groups: Iterable[list[str]]) -> int:
    groups = list(groups)
    print(f"{title}: {len(groups)}")
    for group in groups:
        print("  " + " <-> ".join(group))
    return len(groups)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    top = {package: set() for package in PACKAGES}
    inside: dict[str, dict[str, set[str]]] = {package: {} for package in PACKAGES}
    for module in graph.modules:
        package = module.split(".")[0]
        for imported in graph.find_modules_directly_imported_by(module):
            other = imported.split(".")[0]
            if other not in top:
                continue
            if other == package:
                inside[package].setdefault(module, set()).add(imported)
            else:
                top[package].add(other)
    between = report("cycles between top-level packages", strongly_connected(top))
    within = report(
        "cycles inside a top-level package",
        (group for package in PACKAGES for group in strongly_connected(inside[package])),
    )
    return 1 if between or within else 0


if __name__ == "__main__":
    sys.exit(main())
