"""``GET /v1/openapi.json`` (issue 13): the proxy's contract, kept in step with its validator.

The document is written by hand (gateway/openapi.py); these tests fail when it and the code
drift apart: a route or method it does not describe, or a field, required name, enum or bound
that ``validation.py`` enforces differently.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver
from rest_framework import fields, serializers
from rest_framework.views import APIView

from gateway import validation
from gateway.doors.responses_translate import ResponseCreateSerializer
from gateway.errors import GatewayError, InvalidRequest
from gateway.openapi import openapi_document
from gateway.openapi_request import NAME, NO_NUL
from switchyard import urls

DOCUMENT = openapi_document()
SCHEMAS = DOCUMENT["components"]["schemas"]
METHODS = ("get", "post", "put", "patch", "delete")


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def test_it_serves_the_document_to_a_caller_without_a_key():
    response = Client().get("/v1/openapi.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert orjson.loads(response.content) == DOCUMENT


def v1_routes() -> dict[str, Any]:
    """``/v1/…`` path template → view, from the URLconf."""
    routes = {}
    for pattern in urls.urlpatterns:
        assert isinstance(pattern, URLPattern | URLResolver)
        route = str(pattern.pattern)
        if route.startswith("v1/"):
            template = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
            routes[f"/{template}"] = pattern.callback
    return routes


def test_it_documents_every_v1_route():
    assert set(DOCUMENT["paths"]) == set(v1_routes())


@pytest.mark.parametrize("path", sorted(v1_routes()))
def test_it_documents_exactly_the_methods_each_route_serves(path):
    view = v1_routes()[path]
    documented = {m for m in DOCUMENT["paths"][path] if m in METHODS}
    view_class = getattr(view, "view_class", None)
    if view_class is not None and issubclass(view_class, APIView):
        served = {m for m in METHODS if hasattr(view_class, m)}
    else:  # the proxy's own views refuse other methods before they look at the key
        url = re.sub(r"\{\w+\}", "x", path)
        served = {m for m in METHODS if getattr(Client(), m)(url).status_code != 405}
    assert documented == served


# --- the body of POST /v1/chat/completions, field by field against the serializers -----------


def check_field(field: fields.Field, schema: dict[str, Any], where: str) -> None:
    """The schema of one property says what the serializer field accepts."""
    schema = resolve(schema)
    if isinstance(field, serializers.ListSerializer):
        assert schema["type"] == "array", where
        assert schema.get("minItems", 0) == (0 if field.allow_empty else 1), where
        assert schema.get("maxItems") == field.max_length, where
        check_serializer(field.child, schema["items"], where)
    elif isinstance(field, serializers.Serializer):
        check_serializer(field, schema, where)
    elif isinstance(field, serializers.ChoiceField):
        assert (schema.get("enum") or [schema.get("const")]) == list(field.choices), where
    elif isinstance(field, validation.StrictCharField):
        expected = NO_NUL if field.allow_blank else NAME
        assert schema["pattern"] == expected["pattern"], where
        assert schema.get("maxLength") == field.max_length, where
    elif isinstance(field, validation.StrictBooleanField):
        assert schema == {"type": "boolean"}, where
    elif isinstance(field, validation.StrictIntegerField | validation.StrictFloatField):
        kind = "integer" if isinstance(field, validation.StrictIntegerField) else "number"
        assert schema["type"] == kind, where
        assert schema.get("minimum") == field.min_value, where
        assert schema.get("maximum") == field.max_value, where
    elif isinstance(field, serializers.DictField):
        assert schema["type"] == "object", where
    elif isinstance(field, validation.BoundedObjectField):  # JSON Schema cannot bound bytes
        assert schema["type"] == "object", where
        assert f"at most {field.max_bytes} bytes" in schema["description"], where
    elif isinstance(field, validation.MetadataField):
        assert schema["maxProperties"] == validation.MAX_METADATA_PAIRS, where
        assert schema["propertyNames"]["maxLength"] == validation.MAX_METADATA_KEY, where
        assert schema["additionalProperties"]["maxLength"] == validation.MAX_METADATA_VALUE, where
    elif isinstance(field, serializers.ListField):
        assert schema["type"] == "array", where
        assert schema.get("maxItems") == field.max_length, where
        check_field(field.child, schema["items"], f"{where}[]")
    else:  # the custom fields (content, stop, tool_choice): one of several shapes
        assert "oneOf" in schema or (field.allow_null and schema == {"type": "null"}), where


def check_serializer(serializer: serializers.Serializer, schema: dict[str, Any], where: str):
    schema = resolve(schema)
    if serializer.__class__ is validation.MessageSerializer:
        check_message(serializer, schema, where)
        return
    assert set(schema["properties"]) == set(serializer.fields), where
    required = {name for name, field in serializer.fields.items() if field.required}
    assert set(schema.get("required", ())) == required, where
    for name, field in serializer.fields.items():
        check_field(field, schema["properties"][name], f"{where}.{name}")


def check_message(serializer: validation.MessageSerializer, schema: dict[str, Any], where: str):
    """A message is one schema per role (the validator's cross-field rules, which the generated
    bodies below test): together they take every role and every field."""
    variants = schema["oneOf"]
    roles = [r for v in variants for r in v["properties"]["role"].get("enum", ())]
    roles += [
        v["properties"]["role"]["const"] for v in variants if "const" in v["properties"]["role"]
    ]
    assert set(roles) == set(validation.ROLES), where
    properties = {name for v in variants for name in v["properties"]}
    assert properties == set(serializer.fields), where
    for variant in variants:
        for name, property_schema in variant["properties"].items():
            if name != "role" and property_schema is not False:  # False: must be absent
                check_field(serializer.fields[name], property_schema, f"{where}.{name}")


def test_its_body_schema_matches_the_validators_fields_requirements_and_bounds():
    check_serializer(
        validation.ChatCompletionSerializer(), SCHEMAS["ChatCompletionRequest"], "body"
    )


def test_its_error_types_are_those_of_the_error_classes():
    def subclasses(cls):
        return {cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))}

    error = SCHEMAS["ErrorEnvelope"]["properties"]["error"]
    assert set(error["properties"]["type"]["enum"]) == {c.type for c in subclasses(GatewayError)}
    assert set(error["required"]) == set(InvalidRequest("x").envelope()["error"])


def test_its_responses_body_schema_matches_the_validators_fields_requirements_and_bounds():
    check_serializer(ResponseCreateSerializer(), SCHEMAS["ResponseCreateRequest"], "body")
