"""Celery tasks: thin wrappers that call one service each."""

from celery import shared_task

from gateway import ledger


@shared_task(acks_late=True, ignore_result=True)
def ledger_flush() -> int:
    return ledger.ledger_flush()
