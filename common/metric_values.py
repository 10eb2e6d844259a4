"""prometheus_client's multiprocess values, with the process id read once per process.

In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``: every deployment with more than one worker)
prometheus_client asks the kernel for the process id (``os.getpid``) at every increment of every
metric, so as to notice a fork that would otherwise write into the parent's file: 28 system
calls per proxied request (``bench/cpu_per_request.py --strace``). Its own extension point,
``MultiProcessValue(process_identifier)``, takes the id from here instead: read once at import,
and read again in a child right after a fork (``os.register_at_fork``), which is all the check
needs to see.

Imported by every module that defines metrics, before it defines them (a value takes its class
when it is made). The class is installed once per process: two would each map the process's
file and overwrite each other's entries.
"""

from __future__ import annotations

import os

from prometheus_client import values

_pid = os.getpid()


def process_id() -> int:
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if values.ValueClass is not values.MutexValue:  # multiprocess mode
    os.register_at_fork(after_in_child=_forked)
    values.ValueClass = values.MultiProcessValue(process_id)
