"""Output quality the router can measure (SPEC G8): tool-call arguments that do not fit the
tool's JSON schema — or are not JSON at all — are bad output.

jsonschema is imported by the first answer with a tool call to check against a schema, not
with the gateway: a worker that never sees one does not hold it (~3 MiB of its RSS).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson


def tool_calls_malformed(
    tools: Iterable[Mapping[str, Any]] | None, calls: Iterable[Mapping[str, Any]]
) -> bool | None:
    """True if any call's arguments break its tool's schema; None when there is nothing to check."""
    schemas = {
        (tool.get("function") or {}).get("name"): (tool.get("function") or {}).get("parameters")
        for tool in tools or ()
    }
    checked = False
    for call in calls:
        function = call.get("function") or {}
        checked = True
        try:
            arguments = orjson.loads(function.get("arguments") or "")
        except orjson.JSONDecodeError:
            return True
        schema = schemas.get(function.get("name"))
        if not isinstance(arguments, dict):
            return True
        if isinstance(schema, Mapping):
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import SchemaError

            try:
                if not Draft202012Validator(schema).is_valid(arguments):
                    return True
            except SchemaError:
                continue  # the caller's schema is broken, not the provider's output
    return False if checked else None
