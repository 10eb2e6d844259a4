"""The chat completion request's schemas in the OpenAPI document (``openapi.py``): messages,
content parts, tools, provider preferences and the body itself, with the bounds and choices of
the validator that enforces them (``validation.py``).
"""

from __future__ import annotations

from typing import Any

from gateway import validation
from gateway.validation import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, ROLES

Schema = dict[str, Any]
PERCENTILE_KEYS = ("p50", "p75", "p90", "p99")


def schema_ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


STRING: Schema = {"type": "string"}
# What Python's str.strip() removes (every str.isspace() character), as DRF's CharField trims;
# ECMA-262's \s, which a schema's pattern means, is another set.
BLANK = r"\t-\r\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# DRF's CharField (validation.StrictCharField): no NUL, and not blank once trimmed.
NAME: Schema = {"type": "string", "pattern": f"^[^\\u0000]*[^{BLANK}\\u0000][^\\u0000]*$"}
NO_NUL: Schema = {"type": "string", "pattern": r"^[^\u0000]*$"}
# Schemas are written without not/if/anyOf where a oneOf of disjoint cases says the same: a
# generator builds those cases directly instead of drawing and throwing most away.
CONTENT_PART: Schema = {
    "oneOf": [
        {
            "type": "object",
            "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": NO_NUL},
        },
        {
            "type": "object",
            "required": ["type"],
            "description": "Carries what its provider expects (image_url, input_audio, file).",
            "properties": {"type": {"enum": ["image_url", "input_audio", "file"]}, "text": NO_NUL},
        },
    ]
}
CONTENT: Schema = {
    "oneOf": [
        STRING,
        {"type": "array", "items": schema_ref("ContentPart"), "maxItems": MAX_CONTENT_PARTS},
    ]
}
TOOL_CALL: Schema = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": NAME,
        "type": {"enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": NAME, "arguments": NO_NUL},
        },
    },
}
TOOL_CALLS: Schema = {"type": "array", "items": schema_ref("ToolCall"), "minItems": 1}
# One schema per case of the validator's cross-field rules: content is required except on an
# assistant message that calls tools; only assistants call tools; a tool message names the call
# it answers. (``false``: the field must be absent.)
MESSAGE: Schema = {
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"enum": [r for r in ROLES if r not in ("assistant", "tool")]},
                "content": CONTENT,
                "name": NAME,
                "tool_call_id": NAME,
                "tool_calls": False,
            },
        },
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"const": "assistant"},
                "content": CONTENT,
                "name": NAME,
                "tool_calls": TOOL_CALLS,
                "tool_call_id": NAME,
            },
        },
        {
            "type": "object",
            "required": ["role", "tool_calls"],
            "properties": {
                "role": {"const": "assistant"},
                "content": {"type": "null"},
                "name": NAME,
                "tool_calls": TOOL_CALLS,
                "tool_call_id": NAME,
            },
        },
        {
            "type": "object",
            "required": ["role", "content", "tool_call_id"],
            "properties": {
                "role": {"const": "tool"},
                "content": CONTENT,
                "name": NAME,
                "tool_call_id": NAME,
                "tool_calls": False,
            },
        },
    ]
}
TOOL: Schema = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {**NAME, "maxLength": 64},
                "description": NO_NUL,
                "parameters": {
                    "type": "object",
                    "description": f"a JSON Schema of at most {validation.MAX_SCHEMA_BYTES} bytes",
                },
                "strict": {"type": "boolean"},
            },
        },
    },
}
PROVIDER_PREFERENCES: Schema = {
    "type": "object",
    "description": (
        "OpenRouter-compatible routing overrides (SPEC G13), "
        f"at most {validation.MAX_PROVIDER_BYTES} bytes of JSON."
    ),
    "properties": {
        "order": {"type": ["array", "null"], "items": STRING},
        "only": {"type": ["array", "null"], "items": STRING},
        "ignore": {"type": ["array", "null"], "items": STRING},
        "allow_fallbacks": {"type": "boolean"},
        "require_parameters": {"type": "boolean"},
        "sort": {
            "oneOf": [
                {"enum": ["price", "throughput", "latency", None]},
                {
                    "type": "object",
                    "properties": {
                        "by": {"enum": ["price", "throughput", "latency", None]},
                        "partition": {"enum": ["model", "none"]},
                    },
                },
            ]
        },
        "max_price": {
            "type": ["object", "null"],
            "properties": {
                "prompt": {"type": ["number", "null"], "minimum": 0},
                "completion": {"type": ["number", "null"], "minimum": 0},
            },
        },
        "preferred_min_throughput": schema_ref("Percentiles"),
        "preferred_max_latency": schema_ref("Percentiles"),
        "max_cost_premium": {
            "type": ["number", "null"],
            "minimum": 0,
            "description": (
                "Cost guard (not OpenRouter's): the expected price of the router's traffic mix "
                "at most this fraction above the cheapest eligible endpoint's that can take "
                "more traffic (0.06 = +6 %); null: the model's bound, or with none stated the "
                "default guards (+6 % or price-only routing's price if more, and no slower "
                "than price-only routing)."
            ),
        },
    },
}
# A number (the p50), or percentiles of which the first given is compared (p50 first).
PERCENTILES: Schema = {
    "oneOf": [
        {"type": ["number", "null"], "minimum": 0},
        {
            "type": "object",
            "properties": {p: {"type": ["number", "null"], "minimum": 0} for p in PERCENTILE_KEYS},
            "anyOf": [
                {"required": [p], "properties": {p: {"type": "number"}}} for p in PERCENTILE_KEYS
            ],
        },
    ]
}
CHAT_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {
            **NAME,
            "maxLength": 200,
            "description": "A model id of GET /v1/models; ':floor' sorts by price, "
            "':nitro' by throughput.",
            "examples": ["acme/chat-small"],
        },
        "messages": {
            "type": "array",
            "items": schema_ref("Message"),
            "minItems": 1,
            "maxItems": MAX_MESSAGES,
        },
        "stream": {"type": "boolean"},
        "stream_options": {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}},
            "description": "Only with stream: true.",
        },
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "n": {"type": "integer", "minimum": 1, "maximum": 1},
        "stop": {
            "oneOf": [
                STRING,
                {"type": "array", "items": STRING, "maxItems": 4},
                {"type": "null"},
            ]
        },
        "tools": {"type": "array", "items": schema_ref("Tool"), "maxItems": MAX_TOOLS},
        "tool_choice": {
            "oneOf": [
                {"enum": ["none", "auto", "required", None]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"const": "function"},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": STRING},
                        },
                    },
                },
            ]
        },
        "user": {**NAME, "maxLength": 256},
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": validation.MAX_METADATA_PAIRS,
            "propertyNames": {"maxLength": validation.MAX_METADATA_KEY},
            "additionalProperties": {"type": "string", "maxLength": validation.MAX_METADATA_VALUE},
        },
        "response_format": {
            "type": "object",
            "description": (
                "{type: text | json_object | json_schema, json_schema: …}, "
                f"at most {validation.MAX_SCHEMA_BYTES} bytes of JSON"
            ),
        },
        "parallel_tool_calls": {"type": "boolean"},
        "provider": schema_ref("ProviderPreferences"),
        "models": {
            "type": "array",
            "items": NAME,
            "maxItems": 8,
            "description": "Fallback models, tried after model.",
        },
    },
    # stream_options without stream (or with stream: false) is refused.
    "dependentSchemas": {
        "stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}
    },
}
