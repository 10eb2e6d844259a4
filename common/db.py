"""Database work from the proxy, done in the thread that holds the connection.

Django drops a broken or aged connection at ``request_started`` / ``request_finished``, in the
thread that sends them. The proxy sends them on the event loop's thread, which holds no
connection; its queries run in asgiref's thread for sync code, whose connection was therefore
never checked: after a PostgreSQL restart every proxy query failed on the dead socket
("the connection is closed") until the process restarted. So each piece of the
proxy's database work runs Django's cleanup (``close_old_connections``) in its own thread,
before and after; with ``CONN_HEALTH_CHECKS`` the first query after it tries a kept connection
and opens a new one when the server went away.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

P = ParamSpec("P")
R = TypeVar("R")


def fresh_connection(work: Callable[P, R]) -> Callable[P, R]:
    """``work`` on a connection that is checked first and dropped after if it broke or aged."""

    @wraps(work)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        _connections_checked()
        try:
            return work(*args, **kwargs)
        finally:
            _connections_checked()

    return run


def _connections_checked() -> None:
    """``close_old_connections`` for this thread, but never inside a caller's transaction
    (a test's, say): dropping its connection would lose the transaction."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


class FreshConnectionView:
    """For the proxy's sync DRF views: their whole dispatch on a checked connection."""

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return fresh_connection(super().dispatch)(request, *args, **kwargs)  # type: ignore[misc]


def database_work(work: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``work`` for a coroutine to await: in asgiref's thread, on a checked connection."""
    return sync_to_async(fresh_connection(work))
