"""The discrete-event loop: a heap of ``(time, priority, seq, action, argument)`` (after SimPy).

``seq`` is a counter, so events at the same time and priority run in the order they were
scheduled and a run is deterministic; nothing compares actions or arguments. An action is a
plain callable of one argument, called with the loop's ``now`` already set to its time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

Action = Callable[[Any], None]

# Lower runs first among events of the same time: switching the router at a block boundary
# must happen before the arrivals of that instant.
URGENT = -1
NORMAL = 0


class EventLoop:
    """Simulated time in seconds; ``schedule`` events, ``run`` until a time."""

    __slots__ = ("_heap", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Action, Any]] = []
        self._seq = 0

    def schedule(
        self, at: float, action: Action, argument: Any = None, priority: int = NORMAL
    ) -> None:
        """Run ``action(argument)`` at ``at`` (never before ``now``: time does not go back)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(at, self.now), priority, self._seq, action, argument))

    def run(self, until: float) -> None:
        """Run every event due before ``until``, then leave ``now`` at ``until``."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] < until:
            at, _, _, action, argument = pop(heap)
            self.now = at
            action(argument)
        self.now = max(self.now, until)

    @property
    def pending(self) -> int:
        return len(self._heap)
