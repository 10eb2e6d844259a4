"""Deferred requests (E3, E5): accepted at once with 202, run by the Celery worker, fetched
from /v1/jobs/{id} — surviving a lost task message and a run whose worker died."""

import os
import signal
import time

import httpx
import pytest

from tests.conftest import Blackhole, e2e_config
from tests.stack import Stack, free_port, wait_until

pytestmark = pytest.mark.e2e

INDEXER_KEY = "sk-sy-test-acme-indexer-0001"  # acme/search/indexer: background (defer)
WEB_KEY = "sk-sy-test-acme-web-0001"  # acme/search/web: interactive (reject)
BULK_KEY = "sk-sy-test-acme-bulk-0001"  # background, 2 requests per 10 s
GLOBEX_KEY = "sk-sy-test-globex-0001"
GLOBEX_NIGHTLY_KEY = "sk-sy-test-globex-nightly-01"  # globex/default/nightly: background
TINY_KEY = "sk-sy-test-acme-tiny-0001"  # background, 20 input tokens a minute
SLOW_KEY = "sk-sy-test-acme-slow-0001"  # background, 1 request per 30 s (a try lasts 20 s)
ASYNC = {"Prefer": "respond-async"}


def with_bulk_app(blackhole_port: int, closed_port: int):
    edit = e2e_config(blackhole_port, closed_port)

    def more(config: dict) -> None:
        edit(config)
        config["tenants"][0]["teams"][0]["apps"].append(
            {
                "name": "bulk",
                "environment": "production",
                "default_workload": "background",
                "limits": [{"dimension": "requests", "capacity": 2, "per": "10s"}],
                "keys": [{"name": "ci", "secret": BULK_KEY}],
            }
        )
        for name, limit, secret in (
            ("tiny", {"dimension": "input_tokens", "capacity": 20, "per": "1m"}, TINY_KEY),
            ("slow", {"dimension": "requests", "capacity": 1, "per": "30s"}, SLOW_KEY),
        ):
            config["tenants"][0]["teams"][0]["apps"].append(
                {
                    "name": name,
                    "environment": "production",
                    "default_workload": "background",
                    "limits": [limit],
                    "keys": [{"name": "ci", "secret": secret}],
                }
            )
        config["tenants"][1]["teams"][0]["apps"].append(
            {
                "name": "nightly",
                "environment": "production",
                "default_workload": "background",
                "keys": [{"name": "ci", "secret": GLOBEX_NIGHTLY_KEY}],
            }
        )

    return more


@pytest.fixture(scope="module")
def stack():
    blackhole = Blackhole()
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        config_edit=with_bulk_app(blackhole.port, free_port()),
        # Short leases, so recovery shows within seconds; one Celery process (Stack), so jobs
        # waiting side by side are the runner's doing, not the worker pool's.
        extra_env={"JOB_TRY_SECONDS": "20", "JOB_LEASE_SECONDS": "3", "JOB_RESUME_INTERVAL": "1"},
    )
    try:
        yield running.start()
    finally:
        running.stop()
        blackhole.close()


def submit(stack, key=INDEXER_KEY, headers=ASYNC, **fields):
    body = {"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}], **fields}
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", **headers},
        json=body,
        timeout=30,
    )


def job(stack, location, key=INDEXER_KEY):
    return httpx.get(
        f"{stack.base_url}{location}", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )


def finished(stack, location, key=INDEXER_KEY, timeout=30.0):
    found = {}

    def done():
        found.update(job(stack, location, key).json())
        return found.get("status") in ("succeeded", "failed", "cancelled")

    wait_until(done, timeout=timeout, what=f"job {location} to finish", interval=0.2)
    return found


def test_it_accepts_a_deferred_request_at_once_and_serves_it_from_a_worker(stack):
    accepted = submit(stack)

    assert accepted.status_code == 202, accepted.text
    location = accepted.headers["location"]
    assert location == f"/v1/jobs/{accepted.json()['id']}"
    assert accepted.json()["status"] == "queued"
    done = finished(stack, location)
    assert done["status"] == "succeeded"
    response = done["response"]
    assert response["status_code"] == 200
    assert response["body"]["choices"][0]["message"]["content"]
    assert response["headers"]["x-switchyard-provider"] == response["body"]["provider"]
    assert response["body"]["id"] == done["generation_id"]


def test_it_keeps_jobs_in_line_while_capacity_is_short_not_their_connections(stack):
    started = time.monotonic()
    accepted = [submit(stack, key=BULK_KEY) for _ in range(4)]
    submitted_in = time.monotonic() - started
    time.sleep(1.0)  # bulk's later jobs now wait in the fair queue for its refill…
    other = submit(stack, key=GLOBEX_NIGHTLY_KEY)  # …and another tenant's job comes after them
    sibling = submit(stack, key=INDEXER_KEY)  # …and a job of another app of bulk's own tenant

    assert [a.status_code for a in accepted] == [202] * 4
    assert submitted_in < 3.0  # the app's 2 requests per 10 s do not hold the callers
    served_other = finished(stack, other.headers["location"], GLOBEX_NIGHTLY_KEY)
    jobs = [finished(stack, a.headers["location"], BULK_KEY, timeout=40) for a in accepted]
    assert [j["status"] for j in jobs] == ["succeeded"] * 4
    served_at = sorted(j["finished_at"] for j in jobs)
    assert served_at[-1] - served_at[0] >= 4  # the later two waited for the refill
    # Waiting jobs do not hold the worker: the other tenant's job was served before bulk's last.
    assert served_other["status"] == "succeeded"
    assert served_other["finished_at"] - served_other["created_at"] <= 3
    assert served_other["finished_at"] < served_at[-1]
    # Nor does bulk's own limit hold back its tenant's other app (same flow, its own lane).
    served_sibling = finished(stack, sibling.headers["location"], INDEXER_KEY)
    assert served_sibling["status"] == "succeeded"
    assert served_sibling["finished_at"] - served_sibling["created_at"] <= 3
    assert served_sibling["finished_at"] < served_at[-1]


def refusal_rows(stack, generation_id):
    return stack.sql(
        "SELECT reason_code FROM quotas_reservation WHERE request_id = %s AND outcome = 'refused'",
        generation_id,
    )


def test_it_fails_a_job_that_can_never_be_admitted_at_once_not_at_its_deadline(stack):
    long_prompt = [{"role": "user", "content": "many words " * 100}]  # ~200 tokens > 20

    accepted = submit(stack, key=TINY_KEY, messages=long_prompt)

    assert accepted.status_code == 202, accepted.text
    done = finished(stack, accepted.headers["location"], TINY_KEY, timeout=15)
    assert (done["status"], done["tries"]) == ("failed", 1)  # its deadline is 30 min away
    response = done["response"]
    assert response["status_code"] == 429
    assert response["headers"]["x-switchyard-reason"] == "unsatisfiable"
    assert "can never be admitted" in response["body"]["error"]["message"]
    wait_until(lambda: refusal_rows(stack, done["generation_id"]), timeout=15, what="its row")
    [(reason,)] = refusal_rows(stack, done["generation_id"])
    assert reason.startswith("unsatisfiable:")


def test_a_job_refused_for_a_try_and_served_later_leaves_no_refusal_row_per_try(stack):
    first = submit(stack, key=SLOW_KEY)
    second = submit(stack, key=SLOW_KEY)  # no room within its 20 s try: refused, waits, retries

    done = [finished(stack, a.headers["location"], SLOW_KEY, timeout=60) for a in (first, second)]

    assert [d["status"] for d in done] == ["succeeded"] * 2
    assert max(d["tries"] for d in done) >= 2  # one of them was refused for a try
    served = {d["generation_id"] for d in done}
    kept = "SELECT count(*) FROM quotas_reservation WHERE request_id = ANY(%s) AND outcome <> %s"
    wait_until(lambda: stack.sql(kept, list(served), "refused") == [(2,)], timeout=15, what="rows")
    assert [refusal_rows(stack, g) for g in served] == [[], []]


def test_it_answers_a_repeated_submission_with_the_same_job(stack):
    headers = {**ASYNC, "Idempotency-Key": f"nightly-{time.time_ns()}"}
    first = submit(stack, headers=headers)
    repeat = submit(stack, headers=headers)

    assert first.status_code == repeat.status_code == 202
    assert repeat.json()["id"] == first.json()["id"]
    assert repeat.headers["idempotent-replayed"] == "true"
    assert finished(stack, first.headers["location"])["status"] == "succeeded"


def test_it_refuses_to_defer_interactive_or_streamed_requests(stack):
    interactive = submit(stack, key=WEB_KEY)
    streamed = submit(stack, stream=True)
    plain = submit(stack, key=WEB_KEY, headers={})

    assert interactive.status_code == 400
    assert interactive.json()["error"]["code"] == "deferral_not_allowed"
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"
    assert plain.status_code == 200  # without Prefer: respond-async, answered as before


def test_it_shows_a_job_to_its_own_app_only_and_cancels_only_a_waiting_one(stack):
    location = submit(stack).headers["location"]
    finished(stack, location)

    for other in (WEB_KEY, GLOBEX_KEY):
        answer = job(stack, location, other)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    cancel = httpx.delete(
        f"{stack.base_url}{location}", headers={"Authorization": f"Bearer {INDEXER_KEY}"}
    )
    assert cancel.status_code == 409 and cancel.json()["error"]["code"] == "job_not_cancellable"
    assert job(stack, "/v1/jobs/job-nosuch").status_code == 404


def test_it_refuses_nul_characters_it_could_not_store_with_a_400(stack):
    """PostgreSQL keeps no NUL in text or jsonb (issue 13, defect 5)."""
    nul = [{"role": "user", "content": "a\u0000b"}]
    deferred = submit(stack, messages=nul)
    plain = submit(stack, key=WEB_KEY, headers={}, messages=nul)  # nothing stored: served
    auth = {"Authorization": f"Bearer {INDEXER_KEY}"}
    answers = [
        job(stack, "/v1/jobs/a%00b"),
        httpx.delete(f"{stack.base_url}/v1/jobs/job-a%00b", headers=auth),
        httpx.get(f"{stack.base_url}/v1/generation?id=gen-a%00b", headers=auth),
    ]

    assert deferred.status_code == 400, deferred.text
    error = deferred.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "messages[0].content")
    assert plain.status_code == 200, plain.text
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "id"


def test_it_runs_a_job_whose_task_message_was_lost(stack):
    stop_celery(stack)
    try:
        location = submit(stack).headers["location"]
        # The broker loses the task message (a Redis failover, a purge): nothing will run it…
        assert redis_client(stack).delete(f"{stack.name}-celery") == 1
    finally:
        restart_celery(stack)
    # …but the resume task finds the job still queued, long past its time, and queues it again.
    assert finished(stack, location)["status"] == "succeeded"


def test_it_runs_again_a_job_whose_worker_died_mid_run(stack):
    stop_celery(stack)
    try:
        location = submit(stack).headers["location"]
        job_id = location.rsplit("/", 1)[1]
        # What a worker killed mid-run leaves: the job running, under a lease that expires.
        stack.sql(
            "UPDATE gateway_job SET status = 'running', tries = 1, "
            "lease_until = now() + interval '1 second' WHERE id = %s RETURNING id",
            job_id,
        )
        redis_client(stack).delete(f"{stack.name}-celery")
    finally:
        restart_celery(stack)

    done = finished(stack, location)
    assert done["status"] == "succeeded" and done["tries"] == 2
    assert stack.sql("SELECT lost_runs FROM gateway_job WHERE id = %s", job_id) == [(1,)]


def stop_celery(stack: Stack) -> None:
    process = stack.processes["celery"]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def restart_celery(stack: Stack) -> None:
    stack._start_celery()


def redis_client(stack: Stack):
    import redis

    return redis.Redis.from_url(stack.redis_url)
