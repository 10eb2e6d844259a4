"""Failures logged once per kind per interval, not once per occurrence.

While Redis is away every request, mailbox read and pump fails the same way, many times a
second (a 10 s outage logged 1,686 tracebacks). The first failure of a kind in an interval is
logged with its traceback; the rest are counted and the count is said with the next line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

INTERVAL_SECONDS = 10.0


class FaultLog:
    def __init__(
        self,
        interval: float = INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warning(
        self,
        logger: logging.Logger,
        kind: str,
        message: str,
        *args: object,
        exc_info: bool = True,
    ) -> None:
        """Log ``message`` (with the exception being handled, unless ``exc_info`` is False: a
        state, not a failure) unless ``kind`` was logged less than an interval ago."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._quiet[kind] = self._quiet.get(kind, 0) + 1
            return
        self._last[kind] = now
        quiet = self._quiet.pop(kind, 0)
        if quiet:
            message += " (and %d more times since the last report)"
            args = (*args, quiet)
        logger.warning(message, *args, exc_info=exc_info)


faults = FaultLog()
