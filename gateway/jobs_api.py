"""``GET`` / ``DELETE /v1/jobs/{id}``: a deferred request's state and answer (E3, E5).

A job is visible to the keys of the app that submitted it; any other id, another app's
included, is the same 404.
"""

from __future__ import annotations

import re

from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.db import FreshConnectionView
from gateway import jobs
from gateway.authentication import principal_of
from gateway.errors import InvalidRequest, JobNotCancellable, NotFound
from gateway.models import Job


class JobDetail(FreshConnectionView, APIView):
    renderer_classes = [JSONRenderer]

    def get(self, request: Request, job_id: str) -> Response:
        return Response(jobs.job_data(_own_job(request, job_id)))

    def delete(self, request: Request, job_id: str) -> Response:
        """Cancel a job that is waiting; one that runs or has finished stays as it is."""
        job = _own_job(request, job_id)
        cancelled = jobs.job_cancel(job, timezone.now())
        job.refresh_from_db()
        if not cancelled:
            raise JobNotCancellable(f"Job {job.id} is {job.status}; only a queued job cancels.")
        return Response(jobs.job_data(job))


# The form of a job id; anything else (a NUL, which PostgreSQL cannot even compare) is a 400.
JOB_ID = re.compile(r"job-[A-Za-z0-9_-]{1,36}")


def _own_job(request: Request, job_id: str) -> Job:
    app_id = principal_of(request).app_id
    if not JOB_ID.fullmatch(job_id):
        raise InvalidRequest("Pass the id of a job: /v1/jobs/job-…", param="id")
    job = Job.objects.filter(pk=job_id, app_id=app_id).first()
    if job is None:
        raise NotFound(f"No job {job_id}.")
    return job
