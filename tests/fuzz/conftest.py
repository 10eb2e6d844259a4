import os

import pytest

from tests.stack import Stack


@pytest.fixture(scope="module")
def stack(request):
    """The reference deployment, really started, with a Celery worker for deferred requests;
    the simulator's latencies times the module's LATENCY_SCALE (default 0.01)."""
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=getattr(request.module, "LATENCY_SCALE", 0.01),
    )
    try:
        yield running.start()
    finally:
        running.stop()
