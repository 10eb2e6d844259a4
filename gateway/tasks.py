"""Celery tasks: thin wrappers that call one service each."""

from celery import shared_task
from django.utils import timezone

from gateway import batch_runner, batches, job_runner, jobs, ledger, response_store


@shared_task(acks_late=True, ignore_result=True)
def ledger_flush() -> int:
    return ledger.ledger_flush()


@shared_task(name=jobs.JOB_RUN_TASK, acks_late=True, ignore_result=True)
def job_run(job_id: str) -> str:
    return job_runner.job_run(job_id)


@shared_task(acks_late=True, ignore_result=True)
def jobs_resume() -> int:
    return job_runner.jobs_resume()


@shared_task(acks_late=True, ignore_result=True)
def responses_forget() -> int:
    return response_store.responses_forget(timezone.now())


@shared_task(name=batches.BATCH_RUN_TASK, acks_late=True, ignore_result=True)
def batch_run(batch_id: str) -> str:
    return batch_runner.batch_run(batch_id)


@shared_task(acks_late=True, ignore_result=True)
def batches_resume() -> int:
    return batch_runner.batches_resume()
