"""E5: what a provider batch's written answers cost is owed to the tenant's spend buckets in the
same transaction that writes them, and stays owed until Redis took it — so a driver that dies
between writing and charging leaves the charge to the next one instead of losing it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from gateway.batch_models import Batch, BatchFile
from gateway.models import Job
from gateway.provider_batch_results import _answers_store, _owed_paid

pytestmark = pytest.mark.django_db

OK = {"status_code": 200, "headers": {}, "body": {"id": "x"}}


def batch_with_lines(n: int) -> Batch:
    now = timezone.now()
    source = BatchFile.objects.create(
        id="file-owed", tenant_id=1, purpose=BatchFile.Purpose.BATCH, filename="in.jsonl"
    )
    batch = Batch.objects.create(
        id="batch-owed",
        tenant_id=1,
        app_id=1,
        api_key_id=1,
        endpoint="/v1/chat/completions",
        input_file=source,
        expires_at=now + dt.timedelta(hours=24),
        status=Batch.Status.IN_PROGRESS,
        path="provider",
    )
    for i in range(n):
        Job.objects.create(
            id=f"line-{i}",
            generation_id=f"gen-{i}",
            deadline_at=now + dt.timedelta(hours=24),
            tenant_id=1,
            app_id=1,
            api_key_id=1,
            workload_class="batch",
            model="acme/chat",
            request={"messages": []},
            batch=batch,
        )
    return batch


def owed(batch: Batch) -> float:
    return Batch.objects.values_list("spend_owed", flat=True).get(pk=batch.pk)


def test_the_answers_and_what_they_cost_are_written_together_and_once() -> None:
    batch = batch_with_lines(3)
    answers = [("line-0", 200, OK, 0.25), ("line-1", 200, OK, 0.5), ("nobody", 200, OK, 9.0)]

    written, due = _answers_store(batch.pk, answers, timezone.now())

    assert written == {"line-0", "line-1"}  # a job that is not this batch's is not written
    assert due == pytest.approx(0.75) and owed(batch) == pytest.approx(0.75)
    # The driver died before charging; the next one fetches the same results: nothing is
    # written twice, nothing added twice, and the earlier answers' cost is still owed.
    written, due = _answers_store(batch.pk, [*answers, ("line-2", 200, OK, 1.0)], timezone.now())
    assert written == {"line-2"}
    assert due == pytest.approx(1.75)


def test_a_charge_clears_what_it_paid_and_leaves_what_came_after() -> None:
    batch = batch_with_lines(2)
    _, due = _answers_store(batch.pk, [("line-0", 200, OK, 0.25)], timezone.now())
    _answers_store(batch.pk, [("line-1", 200, OK, 0.5)], timezone.now())  # another writer

    _owed_paid(batch.pk, due)

    assert owed(batch) == pytest.approx(0.5)
    _owed_paid(batch.pk, 0.5)
    assert owed(batch) == 0.0
