"""The Batch API (E5): files checked line by line, batches in OpenAI's shapes, tenant-scoped,
their lines run as jobs and finalized into output and error files."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from gateway import batch_runner, batches, jobs
from gateway.batch_models import Batch, BatchFile
from gateway.batch_runner import Window
from gateway.job_runner import RunEnd
from gateway.models import Job
from tests.personas import ACME_KEY, GLOBEX_KEY, Personas

INDEXER_KEY = "sk-sy-test-acme-indexer-0001"  # another app of ACME_KEY's tenant
NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def line(custom_id: str, **fields: Any) -> dict[str, Any]:
    body = {"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}]}
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
        **fields,
    }


def jsonl(*lines: Any) -> bytes:
    return (
        b"\n".join(orjson.dumps(item) if not isinstance(item, bytes) else item for item in lines)
        + b"\n"
    )


def upload(content: bytes, key: str = ACME_KEY, purpose: str = "batch") -> Any:
    return Client().post(
        "/v1/files",
        {"purpose": purpose, "file": SimpleUploadedFile("in.jsonl", content)},
        headers={"authorization": f"Bearer {key}"},
    )


def call(method: str, url: str, key: str = ACME_KEY, body: Any = None) -> Any:
    client = Client()
    headers = {"authorization": f"Bearer {key}"}
    if method == "GET":
        return client.get(url, headers=headers)
    return client.post(url, body or {}, content_type="application/json", headers=headers)


def batch_post(file_id: str, key: str = ACME_KEY, **fields: Any) -> Any:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **fields,
    }
    return call("POST", "/v1/batches", key, body)


def test_it_stores_a_good_file_and_shows_it_to_its_tenant_only(personas: Personas) -> None:
    answer = upload(jsonl(line("a"), line("b")))

    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert (data["object"], data["purpose"], data["status"]) == ("file", "batch", "processed")
    assert data["id"].startswith("file-") and data["bytes"] > 0
    own = call("GET", f"/v1/files/{data['id']}", INDEXER_KEY)  # another app, same tenant
    assert own.status_code == 200 and own.json()["filename"] == "in.jsonl"
    content = call("GET", f"/v1/files/{data['id']}/content")
    assert content.content == jsonl(line("a"), line("b"))
    for url in (f"/v1/files/{data['id']}", f"/v1/files/{data['id']}/content"):
        other = call("GET", url, GLOBEX_KEY)
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("content", "code", "where"),
    [
        (jsonl(line("a"), line("a")), "duplicate_custom_id", "Line 2"),
        (jsonl(line("a"), b"{not json"), "invalid_json_line", "Line 2"),
        (jsonl(b"[1, 2]"), "invalid_json_line", "Line 1"),
        (jsonl(line("a", method="GET")), "invalid_method", "Line 1"),
        (jsonl(line("a", url="/v1/completions")), "invalid_url", "Line 1"),
        (jsonl(line("a", url=["/v1/chat/completions"])), "invalid_url", "Line 1"),
        (jsonl(line("a", body="hi")), "invalid_body", "Line 1"),
        (jsonl(line("a", body={"messages": []})), "invalid_body", "Line 1"),
        (jsonl(line("a", body={"model": "m", "stream": True})), "invalid_body", "Line 1"),
        (jsonl(line("a", body={"model": "m", "x": "a\u0000b"})), "invalid_body", "Line 1"),
        (jsonl({"method": "POST"}), "missing_custom_id", "Line 1"),
        (jsonl(line("x" * 513)), "invalid_custom_id", "Line 1"),
        (b"\n\n", "empty_file", "Batch file"),
        (b"\xff\xfe", "invalid_file_encoding", "Batch file"),
    ],
)
def test_it_refuses_a_bad_file_naming_the_line_and_the_rule(
    personas: Personas, content: bytes, code: str, where: str
) -> None:
    answer = upload(content)

    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, "file", "invalid_request_error")
    assert error["message"].startswith(where)
    assert not BatchFile.objects.exists()


def test_it_refuses_other_purposes_missing_files_and_bad_ids(personas: Personas) -> None:
    wrong = upload(jsonl(line("a")), purpose="fine-tune")
    no_file = Client().post(
        "/v1/files", {"purpose": "batch"}, headers={"authorization": f"Bearer {ACME_KEY}"}
    )
    bad_id = call("GET", "/v1/files/file-a%00b")
    anonymous = Client().get("/v1/files/file-abc")

    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    assert bad_id.status_code == 400 and bad_id.json()["error"]["param"] == "file_id"
    assert anonymous.status_code == 401


def test_it_creates_a_batch_in_openais_shape(personas: Personas) -> None:
    file_id = upload(jsonl(line("a"))).json()["id"]

    answer = batch_post(file_id, metadata={"nightly": "eval"})

    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert data["object"] == "batch" and data["id"].startswith("batch_")
    assert (data["status"], data["endpoint"], data["completion_window"]) == (
        "validating",
        "/v1/chat/completions",
        "24h",
    )
    assert data["expires_at"] - data["created_at"] == 86400
    assert data["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert data["metadata"] == {"nightly": "eval"}
    assert data["output_file_id"] is None and data["error_file_id"] is None
    assert call("GET", f"/v1/batches/{data['id']}", INDEXER_KEY).status_code == 200
    other = call("GET", f"/v1/batches/{data['id']}", GLOBEX_KEY)
    assert other.status_code == 404


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"endpoint": "/v1/completions"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": {str(n): "v" for n in range(17)}}, "metadata"),
        ({"input_file_id": 7}, "input_file_id"),
        # found by schemathesis: each was a 500 (unhashable lookups, a NUL PostgreSQL refuses)
        ({"endpoint": ["/v1/chat/completions"]}, "endpoint"),
        ({"completion_window": ["24h"]}, "completion_window"),
        ({"input_file_id": "file-\u0000abc"}, "input_file_id"),
    ],
)
def test_it_refuses_a_bad_batch_naming_the_field(
    personas: Personas, fields: dict[str, Any], param: str
) -> None:
    file_id = upload(jsonl(line("a"))).json()["id"]

    answer = batch_post(file_id, **fields)

    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["param"] == param


def test_it_does_not_batch_another_tenants_file(personas: Personas) -> None:
    file_id = upload(jsonl(line("a")), key=GLOBEX_KEY).json()["id"]

    answer = batch_post(file_id)

    assert answer.status_code == 404 and answer.json()["error"]["param"] == "input_file_id"


def test_it_lists_a_tenants_batches_newest_first_in_pages(personas: Personas) -> None:
    file_id = upload(jsonl(line("a"))).json()["id"]
    made = [batch_post(file_id).json()["id"] for _ in range(3)]
    batch_post(upload(jsonl(line("a")), key=GLOBEX_KEY).json()["id"], key=GLOBEX_KEY)

    first = call("GET", "/v1/batches?limit=2").json()
    rest = call("GET", f"/v1/batches?limit=2&after={first['last_id']}").json()

    assert [b["id"] for b in first["data"]] == made[::-1][:2] and first["has_more"] is True
    assert [b["id"] for b in rest["data"]] == made[:1] and rest["has_more"] is False
    assert call("GET", "/v1/batches?limit=0").status_code == 400
    assert call("GET", "/v1/batches?after=nonsense").status_code == 400
    assert call("GET", "/v1/batches", GLOBEX_KEY).json()["data"][0]["id"] not in made


def test_it_cancels_an_open_batch_once(personas: Personas) -> None:
    batch_id = batch_post(upload(jsonl(line("a"))).json()["id"]).json()["id"]

    first = call("POST", f"/v1/batches/{batch_id}/cancel")
    again = call("POST", f"/v1/batches/{batch_id}/cancel")
    other = call("POST", f"/v1/batches/{batch_id}/cancel", GLOBEX_KEY)

    assert first.status_code == 200 and first.json()["status"] == "cancelling"
    assert again.status_code == 200 and again.json()["status"] == "cancelling"
    assert other.status_code == 404
    ended = batches.batch_start(batch_id, NOW)  # a driver finds it: no line was made
    assert ended.status == Batch.Status.CANCELLED
    done = call("POST", f"/v1/batches/{batch_id}/cancel")
    assert done.status_code == 409 and done.json()["error"]["code"] == "batch_not_cancellable"


def started(personas: Personas, *lines: Any) -> Batch:
    batch_id = batch_post(upload(jsonl(*lines)).json()["id"]).json()["id"]
    return batches.batch_start(batch_id, NOW)


def test_it_makes_one_job_per_line_and_starting_twice_makes_no_more(
    personas: Personas, settings: Any
) -> None:
    batch = started(personas, line("a"), line("b"), line("c"))
    again = batches.batch_start(batch.id, NOW)

    assert batch.status == again.status == Batch.Status.IN_PROGRESS
    lines = list(Job.objects.filter(batch=batch).order_by("line"))
    assert [j.custom_id for j in lines] == ["a", "b", "c"]
    assert {j.workload_class for j in lines} == {settings.BATCH_WORKLOAD}
    assert {j.deadline_at for j in lines} == {batch.expires_at}
    assert batches.batch_data(batch)["request_counts"]["total"] == 3


def test_it_fails_a_batch_whose_lines_ask_another_endpoint(personas: Personas) -> None:
    other = line("b", url="/v1/embeddings", body={"model": "acme/embed-small", "input": "x"})
    batch = started(personas, line("a"), other)

    assert batch.status == Batch.Status.FAILED
    assert batch.errors["data"][0]["line"] == 2
    assert batch.errors["data"][0]["code"] == "mismatched_endpoint"
    assert not Job.objects.filter(batch=batch).exists()


def test_it_takes_each_line_for_one_run_only(personas: Personas) -> None:
    batch = started(personas, line("a"), line("b"), line("c"))

    first = batches.batch_lines_take(batch, 2, NOW)
    second = batches.batch_lines_take(batch, 5, NOW)

    assert [j.custom_id for j in first] == ["a", "b"]
    assert [j.custom_id for j in second] == ["c"]
    assert batches.batch_lines_take(batch, 5, NOW) == []
    assert batches.batch_lines_open(batch) == 3


def test_it_puts_a_dead_workers_line_back_for_its_driver_not_a_task(
    personas: Personas, settings: Any
) -> None:
    settings.JOB_LEASE_SECONDS = 30
    batch = started(personas, line("a"))
    (taken,) = batches.batch_lines_take(batch, 1, NOW)

    due = jobs.jobs_due(NOW + dt.timedelta(seconds=31))

    assert due == []  # no job_run task: the batch's driver runs its lines
    again = batches.batch_lines_take(batch, 1, NOW + dt.timedelta(seconds=31))
    assert [j.id for j in again] == [taken.id] and again[0].lost_runs == 1


def answer(job: Job, status: int, body: dict[str, Any]) -> None:
    jobs.job_finish(job, status, {"status_code": status, "headers": {}, "body": body}, NOW)


def test_it_finalizes_into_output_and_error_files(personas: Personas) -> None:
    batch = started(personas, line("a"), line("b"), line("c"))
    a, b, c = batches.batch_lines_take(batch, 3, NOW)
    answer(a, 200, {"id": "gen-a", "choices": []})
    answer(b, 400, {"error": {"code": "invalid_request"}})
    mid = batches.batch_data(Batch.objects.get(pk=batch.id))
    jobs.job_wait(c, NOW)  # refused for capacity, then…
    batches.batch_lines_stop(batch, NOW, code="batch_cancelled", message="cancelled")

    ended = batches.batch_finalize(batch.id, NOW)
    twice = batches.batch_finalize(batch.id, NOW)

    assert mid["request_counts"] == {"total": 3, "completed": 1, "failed": 1}
    assert ended.status == Batch.Status.COMPLETED and twice.output_file_id == ended.output_file_id
    data = batches.batch_data(ended)
    assert data["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert data["completed_at"] and data["finalizing_at"]
    output = [orjson.loads(x) for x in bytes(ended.output_file.content).splitlines()]
    errors = [orjson.loads(x) for x in bytes(ended.error_file.content).splitlines()]
    assert [(o["custom_id"], o["response"]["status_code"]) for o in output] == [("a", 200)]
    assert output[0]["response"]["request_id"] == a.generation_id and output[0]["error"] is None
    assert output[0]["id"].startswith("batch_req_")
    assert [e["custom_id"] for e in errors] == ["b", "c"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[1]["response"] is None and errors[1]["error"]["code"] == "batch_cancelled"
    assert call("GET", f"/v1/files/{ended.output_file_id}", GLOBEX_KEY).status_code == 404
    content = call("GET", f"/v1/files/{ended.output_file_id}/content")
    assert content.status_code == 200 and b'"custom_id":"a"' in content.content


def test_the_driver_grows_on_idle_capacity_and_backs_off_then_pauses_when_lines_wait(
    settings: Any,
) -> None:
    settings.BATCH_IDLE_WAIT_SECONDS = 0.05
    settings.BATCH_HEADROOM = 0.25
    idle, waited = RunEnd(0.0, 0.9), RunEnd(0.2, 0.9)
    window = Window(4)
    for n in range(20):
        window.ended(idle, float(n))
    assert window.room(20.0) == 4  # idle capacity: up to BATCH_CONCURRENCY lines

    window.ended(waited, 21.0)  # a line waited: the pool is contended
    assert window.room(21.0) == 2
    window.ended(RunEnd(0.0, 0.1), 21.0)  # served at once, but a bucket is nearly empty
    window.ended(waited, 21.0)
    assert window.room(21.0) == 0 and window.room(21.3) == 1  # at one line: a pause
    window.ended(None, 22.0)  # refused for capacity: a longer pause
    assert window.room(22.4) == 0 and window.room(22.6) == 1
    for _ in range(10):
        window.ended(waited, 30.0)
    assert window.room(30.0 + batch_runner.MAX_PAUSE_SECONDS - 0.1) == 0
    assert window.room(30.0 + batch_runner.MAX_PAUSE_SECONDS + 0.1) == 1


def test_the_driver_leaves_a_slot_pool_free_for_what_others_held_at_their_peak(
    settings: Any,
) -> None:
    settings.BATCH_IDLE_WAIT_SECONDS = 0.05
    settings.BATCH_HEADROOM = 0.25
    window = Window(8)
    for n in range(60):
        window.ended(RunEnd(0.0, 0.9), n * 0.1)
    assert window.room(6.0) == 8  # no slot pool seen: AIMD alone

    # A grant in a 6-slot pool left 3 free while 1 of the driver's lines held one: others
    # held 2, so the driver holds at most 6 - 2 - SLOT_RESERVE lines there.
    window.ended(RunEnd(0.0, 0.5, (("team:search:slots", 6, 3),)), 10.0, held=1)
    assert window.room(10.0) == 3
    # Later others held 4 with 2 of the driver's lines in: none left beyond the reserve.
    window.ended(RunEnd(0.0, 0.5, (("team:search:slots", 6, 0),)), 11.0, held=2)
    assert window.room(11.0) == 1
    # A smaller use does not lower the peak; time does, one slot per SLOT_PEAK_FORGET_SECONDS.
    window.ended(RunEnd(0.0, 0.5, (("team:search:slots", 6, 4),)), 12.0, held=1)
    assert window.room(12.0) == 1
    forget = batch_runner.SLOT_PEAK_FORGET_SECONDS
    assert window.room(11.0 + forget + 0.01) == 2  # the 4 seen at 11 s is under 3 by now
    # Others filling the pool leave the driver nothing, until their peak is forgotten by one.
    window.ended(RunEnd(0.0, 0.5, (("team:search:slots", 6, 0),)), 30.0, held=1)
    assert window.room(30.0) == 0
    assert window.room(30.0 + forget - 0.1) == 0
    assert window.room(30.0 + forget + 0.1) == 1


def test_request_counts_follow_a_provider_batchs_progress_until_its_lines_are_answered(
    personas: Personas,
) -> None:
    batch_id = batch_post(upload(jsonl(line("a"), line("b"), line("c"))).json()["id"]).json()["id"]
    batches.batch_start(batch_id, NOW)
    Batch.objects.filter(pk=batch_id).update(
        path="provider", provider_counts={"completed": 2, "failed": 0}
    )

    shown = call("GET", f"/v1/batches/{batch_id}").json()["request_counts"]

    assert shown == {"total": 3, "completed": 2, "failed": 0}  # the provider's, lines unanswered
    Batch.objects.filter(pk=batch_id).update(provider_counts=None)  # back on the line path
    assert call("GET", f"/v1/batches/{batch_id}").json()["request_counts"]["completed"] == 0
