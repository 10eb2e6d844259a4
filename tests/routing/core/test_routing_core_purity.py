"""The routing core imports nothing from Django or Redis (STYLE 6)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_it_imports_without_django_or_redis():
    code = (
        "import sys, routing.core, routing.core.router, routing.core.planner;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'redis', 'rest_framework')];"
        "print(','.join(bad))"
    )
    # A fresh interpreter: nothing imported by the test session leaks in.
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.strip() == ""
