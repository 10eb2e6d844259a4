"""A test-only copy of ``GET /v1/openapi.json`` that a generator can draw from quickly.

The published document is the contract; it allows 4,096 messages of 512 content parts and
free-form objects of any shape, and drawing one chat body from it takes schemathesis 200–400 ms.
The copy keeps every operation, field, enum and bound that matters for what the gateway decides
and shrinks only the room: at most ``MAX_ITEMS`` items per array, objects closed to the fields
they name (free-form ones get a few scalar members), strings short. What it draws is still valid
under the published document, and the run's negative cases still break it field by field.
Authentication is left to the run, which sends the key itself.
"""

from __future__ import annotations

import copy
from typing import Any

ERROR_ENVELOPES = ("ErrorEnvelope", "AnthropicError")  # the Messages door answers in Anthropic's
MAX_ITEMS = 2
MAX_STRING = 24
# A free-form object (metadata-like fields, a tool's parameters, response_format): a few scalar
# members, so it is drawn at once; depth has hand-written cases (test_hostile_input.py).
FREE_FORM = {
    "maxProperties": 2,
    "additionalProperties": {"type": ["string", "integer", "boolean", "null"], "maxLength": 8},
}


def trimmed(document: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """``models``: what ``model`` and a model id are drawn from (a random name is a 404 before
    anything interesting happens), so most generated bodies reach the broker and the router."""
    out = copy.deepcopy(document)
    # The run sends the API key itself (a valid one on most requests): a drawn, or in negative
    # mode broken, Authorization would make most requests a 401 and test nothing behind it.
    out.pop("security", None)
    out["components"].pop("securitySchemes", None)
    for path in out["paths"].values():
        for operation in path.values():
            if isinstance(operation, dict):
                operation.pop("security", None)
    for request in (
        "ChatCompletionRequest",
        "EmbeddingsRequest",
        "MessagesRequest",
        "ResponseCreateRequest",
    ):
        out["components"]["schemas"][request]["properties"]["model"] = {"enum": models}
    for parameter in out["paths"]["/v1/models/{model_id}"]["get"]["parameters"]:
        parameter["schema"] = {"enum": models}
    for name, schema in out["components"]["schemas"].items():
        if name not in ERROR_ENVELOPES:  # responses are validated against them as published
            _trim(schema)
    for parameter in out["components"]["parameters"].values():
        _trim(parameter["schema"])
    for path in out["paths"].values():
        for name, item in path.items():  # a path's own parameters, then each method's
            for parameter in item if name == "parameters" else item.get("parameters", []):
                if "schema" in parameter:
                    _trim(parameter["schema"])
    return out


def _trim(schema: Any) -> None:
    if isinstance(schema, list):
        for item in schema:
            _trim(item)
        return
    if not isinstance(schema, dict):
        return
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if "array" in types:
        schema["maxItems"] = min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS)
    if "string" in types and "pattern" not in schema:
        schema["maxLength"] = min(schema.get("maxLength", MAX_STRING), MAX_STRING)
    if "object" in types and "additionalProperties" not in schema:
        if "properties" in schema:
            schema["additionalProperties"] = False
        else:
            schema.update(copy.deepcopy(FREE_FORM))
    for key, value in schema.items():
        if key == "additionalProperties":
            continue
        if key in ("properties", "dependentSchemas"):
            for sub in value.values():
                _trim(sub)
        elif isinstance(value, dict | list):
            _trim(value)
