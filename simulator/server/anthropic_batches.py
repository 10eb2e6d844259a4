"""Anthropic's Message Batches API on the simulator (E5), in Anthropic's shapes.

``POST /v1/messages/batches`` (``{"requests": [{custom_id, params}]}``), ``GET
/v1/messages/batches/{id}``, ``POST .../cancel``, ``GET .../results`` (JSONL, once the batch
has ``ended``: ``{custom_id, result: {type: succeeded, message} | {type: errored, error} |
{type: canceled}}``). Lines are answered by ``batches.BatchBook``.
"""

from __future__ import annotations

from typing import Any

import orjson

from simulator.server.anthropic_wire import AnthropicWire
from simulator.server.batches import BatchBook, ProviderBatch
from simulator.server.common import BadRequest, Response, load_json_object, rfc3339

PREFIX = "/v1/messages/batches"
MAX_CUSTOM_ID = 64  # Anthropic's: 1-64 of letters, digits, '-' and '_'


class AnthropicBatches:
    def __init__(self, book: BatchBook, wire: AnthropicWire) -> None:
        self.book = book
        self.wire = wire

    @staticmethod
    def handles(path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    def serve(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        rest = [p for p in path.removeprefix(PREFIX).split("/") if p]
        try:
            if not rest and method == "POST":
                return self._create(headers, body)
        except BadRequest as error:
            return self.wire.bad_request(error)
        if not rest or len(rest) > 2:
            return self.wire.not_found(path)
        batch = self.book.get(rest[0])
        if batch is None:
            return self.wire.error(404, f"No batch found with id '{rest[0]}'.")
        action = rest[1] if len(rest) == 2 else ""
        if action == "cancel" and method == "POST":
            self.book.cancel(batch)
        elif action == "results" and method == "GET":
            return self._results(batch)
        elif action or method != "GET":
            return self.wire.not_found(path)
        return Response(200, [], orjson.dumps(self._batch_data(batch)))

    def _create(self, headers: dict[str, str], body: bytes) -> Response:
        if not headers.get("anthropic-version", "").strip():
            raise BadRequest("anthropic-version: header is required")
        requests = load_json_object(body).get("requests")
        if not isinstance(requests, list) or not requests:
            raise BadRequest("requests: must be a non-empty list")
        lines: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        for index, item in enumerate(requests):
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            params = item.get("params") if isinstance(item, dict) else None
            if (
                not isinstance(custom_id, str)
                or not 1 <= len(custom_id) <= MAX_CUSTOM_ID
                or custom_id in seen
            ):
                raise BadRequest(
                    f"requests.{index}.custom_id: must be a unique string of 1-{MAX_CUSTOM_ID} "
                    "characters"
                )
            if not isinstance(params, dict):
                raise BadRequest(f"requests.{index}.params: Field required")
            seen.add(custom_id)
            lines.append((custom_id, orjson.dumps(params)))
        batch = self.book.create("msgbatch_01", lines, headers.get("idempotency-key") or None)
        return Response(200, [], orjson.dumps(self._batch_data(batch)))

    def _batch_data(self, batch: ProviderBatch) -> dict[str, Any]:
        ended = batch.ended_at is not None
        status = "ended" if ended else "canceling" if batch.cancelled else "in_progress"
        unrun = len(batch.lines) - batch.answered
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": {
                "processing": 0 if ended else unrun,
                "succeeded": batch.count(True),
                "errored": batch.count(False),
                "canceled": unrun if ended else 0,
                "expired": 0,
            },
            "ended_at": rfc3339(batch.ended_at) if batch.ended_at is not None else None,
            "created_at": rfc3339(batch.created_at),
            "expires_at": rfc3339(batch.created_at + 86_400),
            "archived_at": None,
            "cancel_initiated_at": (
                rfc3339(batch.cancel_requested_at) if batch.cancel_requested_at else None
            ),
            "results_url": f"{PREFIX}/{batch.id}/results" if ended else None,
        }

    def _results(self, batch: ProviderBatch) -> Response:
        if batch.ended_at is None:
            message = f"Message Batch {batch.id} has not yet ended; results are not available."
            return self.wire.error(400, message)
        records = []
        for line in batch.lines:
            result: dict[str, Any]
            if not line.status:
                result = {"type": "canceled"}
            elif line.status < 400:
                result = {"type": "succeeded", "message": line.answer}
            else:
                result = {"type": "errored", "error": line.answer}
            records.append(orjson.dumps({"custom_id": line.custom_id, "result": result}))
        content = b"\n".join(records) + b"\n"
        return Response(200, [], content, content_type="application/binary")
