"""A deferred job runs at most once at a time, whatever Celery delivers twice (E3, E5)."""

import datetime as dt

import pytest

from gateway import jobs
from gateway.models import Job

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def job(db, settings):
    settings.JOB_LEASE_SECONDS = 90
    settings.JOB_RESUME_INTERVAL = 30
    return Job.objects.create(
        id="job-1",
        generation_id="gen-1",
        created_at=NOW,
        deadline_at=NOW + dt.timedelta(hours=1),
        tenant_id=1,
        app_id=1,
        api_key_id=1,
        workload_class="background",
        model="acme/chat-small",
        request={"model": "acme/chat-small", "messages": []},
        next_try_at=NOW,
    )


def test_it_lets_only_one_delivery_of_a_task_run_the_job(job):
    assert jobs.job_lease(job.id, NOW) is not None
    assert jobs.job_lease(job.id, NOW) is None  # the second delivery stops
    assert Job.objects.get(pk=job.id).tries == 1


def test_it_runs_a_waiting_job_again_only_when_its_time_comes(job):
    leased = jobs.job_lease(job.id, NOW)
    assert leased is not None
    jobs.job_wait(leased, NOW + dt.timedelta(seconds=30))

    assert jobs.job_lease(job.id, NOW + dt.timedelta(seconds=10)) is None
    assert jobs.job_lease(job.id, NOW + dt.timedelta(seconds=30)) is not None


def test_it_queues_a_lost_run_again_and_gives_up_after_three(job):
    for lost in range(1, jobs.MAX_LOST_RUNS):
        jobs.job_lease(job.id, NOW)
        after_lease = NOW + dt.timedelta(seconds=91)
        jobs.jobs_due(after_lease)
        job.refresh_from_db()
        assert (job.status, job.lost_runs) == ("queued", lost)
        job.next_try_at = NOW
        job.save()
    jobs.job_lease(job.id, NOW)
    jobs.jobs_due(NOW + dt.timedelta(seconds=91))
    job.refresh_from_db()
    assert job.status == "failed" and job.response["body"]["error"]["code"] == "job_lost"


def test_it_finds_a_queued_job_whose_task_message_was_lost(job):
    assert jobs.jobs_due(NOW + dt.timedelta(seconds=29)) == []
    assert jobs.jobs_due(NOW + dt.timedelta(seconds=31)) == [job.id]


def test_it_never_changes_a_finished_job(job):
    leased = jobs.job_lease(job.id, NOW)
    assert leased is not None
    jobs.job_finish(leased, 200, {"status_code": 200}, NOW)
    jobs.job_finish(leased, 500, {"status_code": 500}, NOW)
    assert not jobs.job_cancel(leased, NOW)
    job.refresh_from_db()
    assert (job.status, job.response_status) == ("succeeded", 200)


def test_it_forgets_finished_jobs_after_their_retention_but_never_a_waiting_one(job, settings):
    settings.JOB_RETENTION_SECONDS = 3600
    done = Job.objects.create(
        **{**_fields(job), "id": "job-2", "status": "succeeded", "finished_at": NOW}
    )

    assert jobs.jobs_forget(NOW + dt.timedelta(minutes=59)) == 0
    assert jobs.jobs_forget(NOW + dt.timedelta(minutes=61)) == 1
    assert not Job.objects.filter(pk=done.pk).exists()
    assert Job.objects.filter(pk=job.pk).exists()  # queued: kept, however old


def _fields(job: Job) -> dict:
    return {f.name: getattr(job, f.name) for f in Job._meta.fields}


def test_it_keeps_an_answer_with_a_nul_character_postgresql_could_not_store(job):
    jobs.job_finish(job, 200, {"choices": [{"message": {"content": "a\u0000b"}}]}, NOW)

    stored = Job.objects.get(pk=job.id)
    assert stored.status == Job.Status.SUCCEEDED
    assert stored.response["choices"][0]["message"]["content"] == "a\ufffdb"


def test_it_runs_a_lost_run_again_in_the_same_resume_pass_that_finds_it(job):
    jobs.job_lease(job.id, NOW)

    # Not one resume interval later: the pass that sees the expired lease queues its task.
    assert jobs.jobs_due(NOW + dt.timedelta(seconds=91)) == [job.id]


def test_it_lets_a_job_that_met_redis_away_wait_and_try_again_until_its_last_try(
    job, settings, monkeypatch
):
    from asgiref.sync import async_to_sync
    from redis.exceptions import ConnectionError as RedisConnectionError

    from gateway import pipeline
    from gateway.errors import CapacityRefused
    from gateway.snapshot import holder

    async def redis_away():
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(holder, "get", redis_away)

    def attempt(*, last_try):
        return async_to_sync(pipeline.job_attempt)(job, try_until=0.0, last_try=last_try)

    waiting = attempt(last_try=False)
    assert isinstance(waiting, CapacityRefused)
    assert waiting.reason == "broker_unavailable" and waiting.retry_after > 0
    answered = attempt(last_try=True)  # the deadline has come: the outage is the answer
    assert answered.status_code == 503
