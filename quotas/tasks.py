"""Celery tasks of the broker: thin wrappers that call one service each."""

from celery import shared_task

from quotas import services


@shared_task(acks_late=True, ignore_result=True)
def lease_reap() -> int:
    return services.lease_reap()
