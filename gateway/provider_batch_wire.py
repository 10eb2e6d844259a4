"""E5: a provider's own batch API, spoken on its wire — OpenAI's files + batches, Anthropic's
message batches: upload and create, look, cancel, fetch the results.

The lines go out as the adapters build single requests (``build_request``), each under its
job's id as ``custom_id``; the results come back as ``(custom_id, status, body)`` with the body
a live call's answer on that wire (or its error envelope), for ``provider_batch_results.py`` to
reconcile. No retries here: a failed call raises ``ProviderBatchError`` and the driver looks
again at its next poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gateway.providers import adapter_for
from gateway.providers.anthropic import API_VERSION
from gateway.upstream import client_for
from routing.catalogue import EndpointEntry

OPENAI_LINE_URL = "/v1/chat/completions"  # a line's url in OpenAI's batch file
COMPLETION_WINDOW = "24h"  # the only window OpenAI's batches take
# An errored message-batch result carries the error a live call would have had, without its
# HTTP status: the status of that error type.
ANTHROPIC_STATUSES = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


class ProviderBatchError(Exception):
    """The provider did not do what was asked (unreachable, or answered non-2xx)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ProviderBatchState:
    ended: bool
    completed: int  # lines answered 2xx so far
    failed: int  # lines answered otherwise so far


@dataclass(frozen=True)
class LineResult:
    custom_id: str
    status: int  # the line's HTTP status; 0: not run (cancelled, expired)
    body: dict[str, Any]  # the live call's answer on this wire, or its error envelope


def line_json(endpoint: EndpointEntry, body: dict[str, Any]) -> dict[str, Any]:
    """A canonical (OpenAI chat) body as one line of the provider's batch: its wire request's
    JSON, built as a live call's (raises ``RequestNotSupported`` as it would)."""
    adapter = adapter_for(endpoint.provider.protocol)
    wire = adapter.build_request(
        body,
        upstream_model=endpoint.upstream_model,
        api_key="",
        stream=False,
        max_output=endpoint.max_output,
    )
    return wire.json


async def batch_submit(
    endpoint: EndpointEntry, lines: list[tuple[str, dict[str, Any]]], key: str
) -> str:
    """Send ``(custom_id, wire JSON)`` lines as one provider batch; its id. ``key`` goes out as
    ``Idempotency-Key``: a driver that died after sending gets the same batch back."""
    if _anthropic(endpoint):
        requests = [{"custom_id": cid, "params": params} for cid, params in lines]
        data = await _call(endpoint, "POST", "/v1/messages/batches", {"requests": requests}, key)
        return str(data["id"])
    content = b"".join(
        orjson.dumps({"custom_id": cid, "method": "POST", "url": OPENAI_LINE_URL, "body": body})
        + b"\n"
        for cid, body in lines
    )
    file = await _call(
        endpoint,
        "POST",
        "/files",
        files={"file": ("batch.jsonl", content, "application/jsonl")},
        form={"purpose": "batch"},
    )
    create = {
        "input_file_id": file["id"],
        "endpoint": OPENAI_LINE_URL,
        "completion_window": COMPLETION_WINDOW,
    }
    data = await _call(endpoint, "POST", "/batches", create, key)
    return str(data["id"])


async def batch_look(endpoint: EndpointEntry, batch_id: str) -> ProviderBatchState:
    if _anthropic(endpoint):
        data = await _call(endpoint, "GET", f"/v1/messages/batches/{batch_id}")
        counts = data.get("request_counts") or {}
        return ProviderBatchState(
            ended=data.get("processing_status") == "ended",
            completed=int(counts.get("succeeded", 0)),
            failed=int(counts.get("errored", 0)),
        )
    data = await _call(endpoint, "GET", f"/batches/{batch_id}")
    counts = data.get("request_counts") or {}
    return ProviderBatchState(
        ended=data.get("status") in ("completed", "failed", "expired", "cancelled"),
        completed=int(counts.get("completed", 0)),
        failed=int(counts.get("failed", 0)),
    )


async def batch_cancel(endpoint: EndpointEntry, batch_id: str) -> None:
    path = (
        f"/v1/messages/batches/{batch_id}/cancel"
        if _anthropic(endpoint)
        else f"/batches/{batch_id}/cancel"
    )
    await _call(endpoint, "POST", path, {})


async def batch_results(endpoint: EndpointEntry, batch_id: str) -> list[LineResult]:
    """Every line the ended batch answered; lines it did not run come back with status 0 (or
    not at all, as OpenAI leaves them out)."""
    if _anthropic(endpoint):
        raw = await _fetch(endpoint, f"/v1/messages/batches/{batch_id}/results")
        return [_anthropic_result(orjson.loads(line)) for line in raw.splitlines() if line.strip()]
    data = await _call(endpoint, "GET", f"/batches/{batch_id}")
    results: list[LineResult] = []
    for name in ("output_file_id", "error_file_id"):
        if data.get(name):
            raw = await _fetch(endpoint, f"/files/{data[name]}/content")
            results.extend(_openai_result(orjson.loads(x)) for x in raw.splitlines() if x.strip())
    return results


def _anthropic_result(record: dict[str, Any]) -> LineResult:
    result = record.get("result") or {}
    kind = result.get("type")
    if kind == "succeeded":
        return LineResult(record["custom_id"], 200, result.get("message") or {})
    if kind == "errored":
        error = result.get("error") or {}
        status = ANTHROPIC_STATUSES.get(str((error.get("error") or {}).get("type")), 500)
        return LineResult(record["custom_id"], status, error)
    return LineResult(record["custom_id"], 0, {})  # canceled, expired


def _openai_result(record: dict[str, Any]) -> LineResult:
    response = record.get("response") or {}
    if not response:
        return LineResult(record["custom_id"], 0, {})
    return LineResult(
        record["custom_id"], int(response.get("status_code") or 500), response.get("body") or {}
    )


def _anthropic(endpoint: EndpointEntry) -> bool:
    return endpoint.provider.protocol == "anthropic"


def _headers(endpoint: EndpointEntry, key: str | None = None) -> dict[str, str]:
    api_key = endpoint.provider.pool[0].api_key
    headers = (
        {"x-api-key": api_key, "anthropic-version": API_VERSION}
        if _anthropic(endpoint)
        else {"Authorization": f"Bearer {api_key}"}
    )
    if key:
        headers["Idempotency-Key"] = key
    return headers


async def _send(
    endpoint: EndpointEntry,
    method: str,
    path: str,
    json: dict[str, Any] | None = None,
    key: str | None = None,
    **extra: Any,
) -> httpx.Response:
    base = endpoint.provider.base_url
    try:
        response = await client_for(base).request(
            method, base + path, json=json, headers=_headers(endpoint, key), **extra
        )
    except httpx.TransportError as exc:
        raise ProviderBatchError(f"could not reach {endpoint.provider.name}: {exc!r}") from exc
    if response.status_code >= 300:
        raise ProviderBatchError(
            f"{endpoint.provider.name} answered {method} {path} with {response.status_code}: "
            f"{response.text[:300]}",
            response.status_code,
        )
    return response


async def _call(
    endpoint: EndpointEntry,
    method: str,
    path: str,
    json: dict[str, Any] | None = None,
    key: str | None = None,
    *,
    files: Any = None,
    form: dict[str, str] | None = None,
) -> dict[str, Any]:
    extra: dict[str, Any] = {"files": files, "data": form} if files is not None else {}
    response = await _send(endpoint, method, path, json, key, **extra)
    try:
        data = response.json()
    except ValueError as exc:
        raise ProviderBatchError(f"{endpoint.provider.name} sent no JSON for {path}") from exc
    if not isinstance(data, dict):
        raise ProviderBatchError(f"{endpoint.provider.name} sent no JSON object for {path}")
    return data


async def _fetch(endpoint: EndpointEntry, path: str) -> bytes:
    return (await _send(endpoint, "GET", path)).content
