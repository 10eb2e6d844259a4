import os

import pytest

from tests.stack import Stack


@pytest.fixture(scope="module")
def stack():
    """The reference deployment, really started, with a Celery worker for deferred requests."""
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.01,
    )
    try:
        yield running.start()
    finally:
        running.stop()
