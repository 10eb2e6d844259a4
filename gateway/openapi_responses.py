"""The Responses door's schemas in the OpenAPI document (``openapi.py``): the body of
``POST /v1/responses`` with the bounds and choices of its validator
(``gateway/doors/responses_translate.py``), and the Response object."""

from __future__ import annotations

from gateway import validation
from gateway.doors.responses_translate import INPUT_ROLES
from gateway.openapi_request import NAME, NO_NUL, STRING, Schema, schema_ref
from gateway.validation import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS

PARTS: Schema = {
    "oneOf": [
        STRING,
        {
            "type": "array",
            "maxItems": MAX_CONTENT_PARTS,
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {
                            "type": {"enum": ["input_text", "output_text"]},
                            "text": NO_NUL,
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type", "refusal"],
                        "properties": {"type": {"const": "refusal"}, "refusal": NO_NUL},
                    },
                    {
                        "type": "object",
                        "required": ["type", "image_url"],
                        "properties": {
                            "type": {"const": "input_image"},
                            "image_url": NAME,
                            "detail": {"enum": ["low", "high", "auto"]},
                        },
                    },
                ]
            },
        },
    ]
}
INPUT_ITEM: Schema = {
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "type": {"const": "message"},
                "role": {"enum": list(INPUT_ROLES)},
                "content": PARTS,
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "name", "arguments"],
            "properties": {
                "type": {"const": "function_call"},
                "call_id": {**NAME, "maxLength": 256},
                "name": {**NAME, "maxLength": 64},
                "arguments": NO_NUL,
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": {**NAME, "maxLength": 256},
                "output": PARTS,
            },
        },
    ]
}
FUNCTION_TOOL: Schema = {
    "type": "object",
    "required": ["type", "name"],
    "properties": {
        "type": {"enum": ["function"]},
        "name": {**NAME, "maxLength": 64},
        "description": NO_NUL,
        "parameters": {
            "type": "object",
            "description": f"a JSON Schema of at most {validation.MAX_SCHEMA_BYTES} bytes",
        },
        "strict": {"type": "boolean"},
    },
}
TEXT_FORMAT: Schema = {
    "type": "object",
    "required": ["type"],
    "description": "json_schema needs name and schema.",
    "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "name": {**NAME, "maxLength": 64},
        "schema": {
            "type": "object",
            "description": f"a JSON Schema of at most {validation.MAX_SCHEMA_BYTES} bytes",
        },
        "description": NO_NUL,
        "strict": {"type": "boolean"},
    },
}
RESPONSE_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {**NAME, "maxLength": 200, "examples": ["acme/chat-small"]},
        "input": {
            "oneOf": [
                {**STRING, "description": "One user message."},
                {
                    "type": "array",
                    "items": INPUT_ITEM,
                    "minItems": 1,
                    "maxItems": MAX_MESSAGES,
                },
            ]
        },
        "instructions": {**NO_NUL, "description": "The system message; not carried over."},
        "previous_response_id": {
            **NAME,
            "maxLength": 64,
            "description": "A stored response of this app: its input and output come first.",
        },
        "store": {"type": "boolean"},
        "stream": {"type": "boolean"},
        "background": {"type": "boolean"},
        "tools": {"type": "array", "items": FUNCTION_TOOL, "maxItems": MAX_TOOLS},
        "tool_choice": {
            "oneOf": [
                {"enum": ["none", "auto", "required", None]},
                {
                    "type": "object",
                    "required": ["type", "name"],
                    "properties": {"type": {"const": "function"}, "name": STRING},
                },
            ]
        },
        "parallel_tool_calls": {"type": "boolean"},
        "text": {
            "type": "object",
            "properties": {
                "format": TEXT_FORMAT,
                "verbosity": {"enum": ["low", "medium", "high"]},
            },
        },
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "user": {**NAME, "maxLength": 256},
        "safety_identifier": {**NAME, "maxLength": 256},
        "prompt_cache_key": {**NAME, "maxLength": 256},
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": validation.MAX_METADATA_PAIRS,
            "propertyNames": {"maxLength": validation.MAX_METADATA_KEY},
            "additionalProperties": {"type": "string", "maxLength": validation.MAX_METADATA_VALUE},
        },
        "provider": schema_ref("ProviderPreferences"),
        "models": {
            "type": "array",
            "items": NAME,
            "maxItems": 8,
            "description": "Fallback models, tried after model.",
        },
    },
}
RESPONSE: Schema = {
    "type": "object",
    "required": ["id", "object", "created_at", "status", "model", "output"],
    "description": "OpenAI's Response object; stream: true sends its events instead.",
    "properties": {
        "id": {"type": "string", "pattern": "^resp_"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
        "model": STRING,
        "output": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": ["object", "null"]},
        "previous_response_id": {"type": ["string", "null"]},
        "store": {"type": "boolean"},
        "provider": STRING,
    },
}
RESPONSE_DELETED: Schema = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {
        "id": STRING,
        "object": {"const": "response.deleted"},
        "deleted": {"const": True},
    },
}
