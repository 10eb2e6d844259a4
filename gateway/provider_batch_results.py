"""E5: a provider batch's answers reconciled — each line's answer written into its job exactly
once (a conditional update of a queued job), after its ledger row (keyed by the line's
generation id, so a second writer's row is dropped), priced at the endpoint's prices less its
``batch_discount``; the tenant's spend buckets are charged what the written lines cost —
recorded as owed in the answers' transaction and cleared once charged, so a driver that dies
between the two leaves the charge to the next, not lost (a death between the charge and the
clearing charges it twice: a budget errs on the side of spending less).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from common.db import database_work
from gateway import ledger
from gateway.batch_models import Batch
from gateway.call import DEFAULT_WORKLOAD, Call
from gateway.dispatch import caller_error
from gateway.doors.base import Rendering
from gateway.doors.chat import CHAT
from gateway.models import Job
from gateway.provider_batch_lines import Heartbeat, line_parse, lines_open
from gateway.provider_batch_rule import batch_price, spend_buckets
from gateway.provider_batch_wire import LineResult
from gateway.providers import adapter_for
from gateway.providers.base import StreamError, Usage
from gateway.records import generation_record, usage_cost
from gateway.snapshot import Snapshot
from quotas.broker import broker_get
from routing.catalogue import EndpointEntry

# A line the provider's batch answered with one of these is not written: it runs here, line by
# line, where the pipeline retries it within the batch class's budget (as any live call).
RETRIED_HERE = frozenset({429, 500, 502, 503, 504, 529})


async def results_write(
    batch: Batch, snapshot: Snapshot, endpoint: EndpointEntry, results: list[LineResult]
) -> int:
    """Each run line's answer into its job, once; its ledger row first. Lines written."""
    jobs = {job.id: job for job in await database_work(lines_open)(batch)}
    principal = snapshot.keys.principal_of(batch.api_key_id, now=time.time())
    model = snapshot.catalogue.models.get(endpoint.model_slug)
    workload = snapshot.quotas.workloads.get(settings.BATCH_WORKLOAD, DEFAULT_WORKLOAD)
    priced = batch_price(endpoint)
    answers: list[tuple[str, int, dict[str, Any], float]] = []
    heartbeat = Heartbeat(batch.id)
    for result in results:
        await heartbeat.beat()
        job = jobs.get(result.custom_id)
        if job is None or not result.status or result.status in RETRIED_HERE:
            continue  # not this batch's, answered already, never run, or to run here
        call = Call(id=job.generation_id, created=job.created_at.timestamp(), door=CHAT)
        call.started -= time.time() - call.created  # its latency: from the batch's start
        call.principal, call.model, call.workload, call.endpoint = (
            principal,
            model,
            workload,
            priced,
        )
        call.attempts = 1
        call.explanation.append(f"provider_batch:{batch.provider_batch_id}")
        status, stored, usage, finish = await _answer(call, job, endpoint, priced, result)
        generation_record(call, status=status, usage=usage, finish_reason=finish)
        answers.append((job.id, status, stored, usage_cost(priced, usage) if usage else 0.0))
    await ledger.ledger_committed()
    written, owed = await database_work(_answers_store)(batch.id, answers, timezone.now())
    if owed:
        specs = []
        if principal is not None and model is not None:
            specs = spend_buckets(snapshot, principal, endpoint, model)
        if specs:
            await broker_get().store.charge([(spec, owed) for spec in specs])
        await database_work(_owed_paid)(batch.id, owed)
    return len(written)


async def _answer(
    call: Call, job: Job, endpoint: EndpointEntry, priced: EndpointEntry, result: LineResult
) -> tuple[int, dict[str, Any], Usage | None, str]:
    """The line's stored answer (status, {status_code, headers, body}), usage and finish."""
    adapter = adapter_for(endpoint.provider.protocol)
    if result.status < 400:
        try:
            completion = adapter.parse_completion(
                result.body,
                response_id=call.id,
                model=endpoint.model_slug,
                created=int(call.created),
            )
        except (StreamError, KeyError, TypeError, ValueError):
            result = LineResult(result.custom_id, 502, {})
        else:
            usage = completion.usage or Usage()
            how = Rendering(
                call_id=call.id,
                model=endpoint.model_slug,
                created=int(call.created),
                provider=endpoint.provider.name,
                cost=lambda u: usage_cost(priced, u),
            )
            body = await CHAT.answer(line_parse(job), completion, usage, how)
            call.reason = "ok"
            stored = {"status_code": 200, "headers": {}, "body": body}
            return 200, stored, usage, completion.finish_reason
    classified = adapter.classify(result.status, {}, orjson.dumps(result.body))
    error = caller_error(endpoint.provider.name, result.status, classified, None)
    call.reason = error.reason
    stored = {"status_code": error.status, "headers": {}, "body": error.envelope()}
    return error.status, stored, None, ""


def _answers_store(
    batch_id: str, answers: list[tuple[str, int, dict[str, Any], float]], now: dt.datetime
) -> tuple[set[str], float]:
    """Each answer into its job if the job still waits for one, and what the written ones cost
    added to the batch's spend owed, in one transaction: the ids written and the spend owed
    (this call's and any an earlier driver wrote and did not live to charge)."""
    written: set[str] = set()
    with transaction.atomic():
        for job_id, status, stored, _ in answers:
            updated = Job.objects.filter(pk=job_id, status=Job.Status.QUEUED).update(
                status=Job.Status.SUCCEEDED if status < 400 else Job.Status.FAILED,
                response_status=status,
                response=ledger.without_nul(stored),
                finished_at=now,
                lease_until=None,
            )
            if updated:
                written.add(job_id)
        spent = sum(cost for job_id, _, _, cost in answers if job_id in written)
        if spent:
            Batch.objects.filter(pk=batch_id).update(spend_owed=F("spend_owed") + spent)
        owed = Batch.objects.values_list("spend_owed", flat=True).get(pk=batch_id)
    return written, owed


def _owed_paid(batch_id: str, paid: float) -> None:
    """The spend buckets took ``paid``: no longer owed (what was added since stays)."""
    Batch.objects.filter(pk=batch_id).update(spend_owed=Greatest(F("spend_owed") - paid, 0.0))
