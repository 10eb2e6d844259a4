"""DRF endpoints for API-key callers beside the proxy: ``GET /v1/generation?id=gen-…`` (G15).

The stored record of one request, in OpenRouter's shape (``{"data": {…}}``, its field names),
plus Switchyard's own fields (status, reason code, upstream model, workload class, TTFT).
Records are written off the hot path, so one is found a few seconds after its request ends;
until then, and for the id of another app (of this tenant or another), the answer is the same 404.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.db import FreshConnectionView
from gateway.authentication import principal_of
from gateway.errors import InvalidRequest, NotFound
from gateway.models import Generation
from gateway.selectors import generation_get

# The door a request came in by, in OpenRouter's ``api_type`` words where it has them.
API_TYPES = {
    "chat": "completions",
    "messages": "messages",
    "responses": "responses",
    "embeddings": "embeddings",
}


class GenerationQuery(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.RegexField(r"^gen-[A-Za-z0-9_-]+$", max_length=40)


class GenerationDetail(FreshConnectionView, APIView):
    renderer_classes = [JSONRenderer]

    def get(self, request: Request) -> Response:
        query = GenerationQuery(data=request.query_params)
        if not query.is_valid():
            raise InvalidRequest("Pass the id of a generation: ?id=gen-…", param="id")
        generation_id = query.validated_data["id"]
        principal = principal_of(request)
        generation = generation_get(
            tenant_id=principal.tenant_id, app_id=principal.app_id, generation_id=generation_id
        )
        if generation is None:
            raise NotFound(
                f"No generation {generation_id}. A request is recorded a few seconds after it "
                "finishes."
            )
        return Response({"data": generation_data(generation)})


def generation_data(generation: Generation) -> dict[str, Any]:
    """The record in OpenRouter's field names; what Switchyard does not measure is null."""
    g = generation
    detail = g.detail if isinstance(g.detail, dict) else {}
    cost = float(g.cost)
    return {
        "id": g.id,
        "upstream_id": detail.get("upstream_id"),
        "created_at": g.created_at.isoformat(),
        "model": g.model,
        "app_id": g.app_id,
        "provider_name": g.provider or None,
        "total_cost": cost,
        "usage": cost,
        "cache_discount": None,
        "upstream_inference_cost": None,
        "streamed": g.streamed,
        "cancelled": g.cancelled,
        # Milliseconds from receiving the request to its last byte; the provider's own share
        # (generation_time) is not measured separately.
        "latency": _ms(g.latency_ms),
        "generation_time": None,
        "moderation_latency": None,
        "finish_reason": g.finish_reason or None,
        "native_finish_reason": detail.get("native_finish_reason") or g.finish_reason or None,
        # Usage is the provider's own count, so the plain and native counts agree.
        "tokens_prompt": g.input_tokens,
        "tokens_completion": g.output_tokens,
        "native_tokens_prompt": g.input_tokens,
        "native_tokens_completion": g.output_tokens,
        "native_tokens_cached": g.cached_input_tokens,
        "native_tokens_reasoning": detail.get("reasoning_tokens"),
        "is_byok": False,
        "api_type": API_TYPES.get(detail.get("door", "chat"), "completions"),
        "router": None,
        # Switchyard's own fields.
        "status": g.status,
        "reason_code": g.reason_code or None,
        "upstream_model": g.upstream_model or None,
        "workload_class": g.workload_class or None,
        "attempts": g.attempts,
        "time_to_first_token": _ms(g.ttft_ms),
        "estimated_tokens_prompt": g.estimated_input_tokens,
        "estimated_tokens_completion": g.estimated_output_tokens,
    }


def _ms(value: float | None) -> int | None:
    return None if value is None else round(value)
