"""What the proxy's ledger and jobs refer to: the config file's prune keeps those rows (C8)."""

from __future__ import annotations

from django.db.models import Q

from gateway.models import Generation, Job

JOB_IDS = ("tenant_id", "app_id", "api_key_id")


def ledger_refers(**ids: int) -> bool:
    """Whether a generation or a job refers to these tenant/team/app/key ids."""
    job_ids = {k: v for k, v in ids.items() if k in JOB_IDS}
    return Generation.objects.filter(Q(**ids)).exists() or (
        bool(job_ids) and Job.objects.filter(**job_ids).exists()
    )
