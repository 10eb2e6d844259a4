"""The Messages door's part of ``GET /v1/openapi.json``: ``POST /v1/messages`` and
``/v1/messages/count_tokens``, whose answers and errors are Anthropic's (``doors/messages.py``),
not the chat envelope."""

from __future__ import annotations

from gateway.doors.messages import ERROR_TYPES
from gateway.doors.messages_request import THINKING_TYPES
from gateway.openapi_request import PROVIDER_PREFERENCES, STRING, Schema, schema_ref

INTEGER: Schema = {"type": "integer"}
BLOCK: Schema = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"type": "string", "examples": ["text", "image", "tool_use", "tool_result"]},
        "cache_control": {"type": "object"},
    },
}
CONTENT: Schema = {"oneOf": [STRING, {"type": "array", "items": BLOCK}]}
SYSTEM_BLOCKS: Schema = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": STRING},
    },
}
MESSAGES_REQUEST: Schema = {
    "type": "object",
    "description": "Anthropic's Messages request. Fields not listed go to Anthropic-protocol "
    "providers as they are; provider and models are Switchyard's and are taken out.",
    "required": ["model", "max_tokens", "messages"],
    "properties": {
        "model": STRING,
        "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["user", "assistant", "system"]},
                    "content": CONTENT,
                },
            },
        },
        "system": {"oneOf": [STRING, SYSTEM_BLOCKS]},
        "tools": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "tool_choice": {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}},
        },
        "stop_sequences": {"type": "array", "items": STRING},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "stream": {"type": "boolean"},
        "metadata": {"type": "object", "properties": {"user_id": STRING}},
        "thinking": {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": list(THINKING_TYPES)}, "budget_tokens": INTEGER},
        },
        "provider": PROVIDER_PREFERENCES,
        "models": {"type": "array", "items": STRING, "maxItems": 8},
    },
}
MESSAGE_ANSWER: Schema = {
    "type": "object",
    "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
    "properties": {
        "id": STRING,
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "model": STRING,
        "content": {"type": "array", "items": BLOCK},
        "stop_reason": STRING,
        "stop_sequence": {"type": ["string", "null"]},
        "usage": {
            "type": "object",
            "required": ["input_tokens", "output_tokens"],
            "properties": {
                "input_tokens": INTEGER,
                "output_tokens": INTEGER,
                "cache_read_input_tokens": INTEGER,
                "cache_creation_input_tokens": INTEGER,
            },
        },
    },
}
ANTHROPIC_ERROR: Schema = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message", "code", "reason"],
            "properties": {
                "type": {"enum": sorted(set(ERROR_TYPES.values()))},
                "message": STRING,
                "code": STRING,
                "reason": STRING,
                "param": STRING,
            },
        },
        "request_id": STRING,
    },
}


def _errors(*statuses: int) -> dict[str, Schema]:
    error = {"content": {"application/json": {"schema": schema_ref("AnthropicError")}}}
    described = {
        429: "Refused for capacity; see Retry-After.",
        529: "Overloaded: the providers, their accounts or Switchyard's state; see Retry-After.",
    }
    return {
        str(status): {"description": described.get(status, "Anthropic's error envelope."), **error}
        for status in sorted({*statuses, 500})
    }


MESSAGES_PATHS: Schema = {
    "/v1/messages": {
        "post": {
            "operationId": "messageCreate",
            "description": "Anthropic Messages (x-api-key or Bearer; anthropic-version and "
            "anthropic-beta headers; a query string such as ?beta=true is accepted).",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": schema_ref("MessagesRequest")}},
            },
            "responses": {
                "200": {
                    "description": "The message (stream: true: Anthropic's server-sent events).",
                    "content": {
                        "application/json": {"schema": schema_ref("AnthropicMessage")},
                        "text/event-stream": {"schema": STRING},
                    },
                },
                "202": {
                    "description": "Deferred (Prefer: respond-async): a job.",
                    "content": {"application/json": {"schema": schema_ref("Job")}},
                },
                **_errors(400, 401, 403, 404, 409, 413, 422, 429, 502, 504, 529),
            },
        }
    },
    "/v1/messages/count_tokens": {
        "post": {
            "operationId": "messageCountTokens",
            "description": "Input tokens of a Messages request (max_tokens not needed), as the "
            "broker estimates them; nothing is sent or reserved.",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": schema_ref("MessagesRequest")}},
            },
            "responses": {
                "200": {
                    "description": "The count.",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["input_tokens"],
                                "properties": {"input_tokens": INTEGER},
                            }
                        }
                    },
                },
                **_errors(400, 401, 403, 404, 413, 529),
            },
        }
    },
}
MESSAGES_SCHEMAS: Schema = {
    "MessagesRequest": MESSAGES_REQUEST,
    "AnthropicMessage": MESSAGE_ANSWER,
    "AnthropicError": ANTHROPIC_ERROR,
}
