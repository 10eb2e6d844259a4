"""A bucket spec is hashed once, when made (quotas/core/model.py): equal specs still hash
equal, however they were made, in whatever process."""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from quotas.core.model import BucketSpec, Dimension, Rule

ROOT = Path(__file__).resolve().parents[2]
RPM = BucketSpec("tenant:acme:requests:1m", "tenant:acme", Dimension.REQUESTS, Rule.REFILL, 120, 60)


def test_equal_specs_hash_equal_and_a_changed_one_differs() -> None:
    same = BucketSpec("tenant:acme:requests:1m", "tenant:acme", Dimension.REQUESTS, Rule.REFILL,
                      120.0, 60.0)  # fmt: skip
    assert same == RPM and hash(same) == hash(RPM)
    smaller = replace(RPM, capacity=60)
    assert smaller != RPM and hash(smaller) != hash(RPM)
    assert hash(smaller) == hash(replace(smaller))
    assert {RPM: "found"}[same] == "found"


def test_a_spec_unpickled_in_another_process_hashes_as_one_made_there() -> None:
    """A string's hash differs between processes: the hash travels not with the spec."""
    script = (
        "import pickle, sys\n"
        "from quotas.core.model import BucketSpec, Dimension, Rule\n"
        "spec = pickle.loads(sys.stdin.buffer.read())\n"
        "made = BucketSpec('tenant:acme:requests:1m', 'tenant:acme', Dimension.REQUESTS,"
        " Rule.REFILL, 120, 60)\n"
        "print(spec == made, hash(spec) == hash(made), {made: 1}.get(spec))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        input=pickle.dumps(RPM),
        capture_output=True,
        env={"PYTHONHASHSEED": "4242", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"True", b"True", b"1"]
