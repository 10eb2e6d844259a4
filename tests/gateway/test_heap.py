"""What a gateway worker does to its heap once started (gateway/asgi.py): what start-up built
is left out of later collections, and the youngest generation is collected less often."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc
from gateway import asgi
before = gc.get_threshold()
asgi._startup_heap_freeze()
print(before[0], gc.get_freeze_count() > 100_000, *gc.get_threshold())
print(asgi.YOUNG_COLLECTION_THRESHOLD)
"""


def test_after_start_up_the_heap_is_frozen_and_young_collections_are_rarer() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    default, frozen, young, older, oldest, configured = done.stdout.split()
    assert (default, frozen) == ("700", "True")
    assert (young, older, oldest) == (configured, "10", "10")  # the older ones as they were
    assert int(configured) > int(default)
