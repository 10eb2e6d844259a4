"""What a server process (``switchyard.asgi``, the module uvicorn loads) leaves unimported:
client code no server path runs, which installed test tools would otherwise pull into every
worker's memory (httpx's command line, ~2.3 MiB; ``requests``, ~4.4 MiB)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def loaded_after(*modules: str) -> set[str]:
    probe = (
        f"import sys, {', '.join(modules)}\n"
        "print(' '.join(m for m in ('requests', 'httpx._main', 'rich') if sys.modules.get(m)))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "switchyard.settings"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def test_a_server_process_loads_neither_requests_nor_httpx_command_line() -> None:
    """In uvicorn's order: its HTTP protocol class (``--http``) first, then the application."""
    assert loaded_after("gateway.server", "switchyard.asgi") == set()


def test_the_gateway_package_alone_would_load_them() -> None:
    """What the entry point prevents: Django REST framework and httpx import them when they are
    installed (here they are: the test tools need them)."""
    assert {"requests", "httpx._main"} <= loaded_after("gateway.asgi")
