"""``kill -USR1 <worker pid>``: the worker writes every asyncio task's await chain to stderr
(its log). For a request that hangs, this names the ``await`` it is stuck on — what neither
py-spy (threads only) nor faulthandler can show for coroutines."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys


def tasks_dump() -> None:
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} asyncio tasks (SIGUSR1) ---", file=sys.stderr)
    for task in tasks:
        task.print_stack(limit=12, file=sys.stderr)
    print("--- end of tasks ---", file=sys.stderr, flush=True)


def tasks_dump_install() -> None:
    """On the running loop; called at lifespan startup (a no-op where signals cannot be set)."""
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, tasks_dump)
