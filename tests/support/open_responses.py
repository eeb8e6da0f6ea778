"""Validate Responses, items and stream events against the Open Responses specification.

The specification is OpenAI's public OpenAPI 3.1 document of the Responses API
(github.com/openresponses/openresponses, ``public/openapi/openapi.json``). It is not part of
this repository: it is read from ``$SERVE_APP_OPEN_RESPONSES_SPEC``, else from
``<repo>/../shared/open-responses/openapi.json``; without it, the checks skip the test that
asked for them, saying so.

What the specification adds to the openai SDK's models: which fields a Response must carry
(``truncation``, ``service_tier``, the penalties... every one, with a value or null) and which
may not be null (a reasoning item's ``encrypted_content`` is left out, never null).

It describes a subset of OpenAI's types: function tools only; message, function call and
output, reasoning and compaction items; not the ``reasoning_text`` or custom tool events. So
its unions are read as open: an object whose ``type`` names none of a union's members is an
OpenAI type the specification leaves out, and is left to the SDK's models. A known ``type`` is
held to its schema. Two errors of the document itself are corrected, each against the
document's own word (see ``_correct_errata``).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import referencing
import referencing.jsonschema

from tests.support import REPO

SPEC_ENV = "SERVE_APP_OPEN_RESPONSES_SPEC"
DEFAULT_SPEC = REPO.parent / "shared" / "open-responses" / "openapi.json"
# The schemas of POST /responses/compact's answer, vendored (source and licence in its
# README.md): the compaction checks run without the whole document too (in CI).
COMPACT_SUBSET = REPO / "tests" / "fixtures" / "open_responses" / "compact_subset.json"
_BASE = "urn:open-responses"


# Every field OpenAI's Response carries (the specification's ResponseResource, and `user`,
# `prompt_cache_retention`, `prompt_cache_options` as applied and `prompt_cache_diagnostics`,
# which OpenAI sends too).
RESPONSE_FIELDS = {
    "id", "object", "created_at", "completed_at", "status", "incomplete_details", "model",
    "previous_response_id", "instructions", "output", "error", "tools", "tool_choice",
    "truncation", "parallel_tool_calls", "text", "top_p", "presence_penalty",
    "frequency_penalty", "top_logprobs", "temperature", "reasoning", "usage",
    "max_output_tokens", "max_tool_calls", "store", "background", "service_tier", "metadata",
    "safety_identifier", "prompt_cache_key", "user", "prompt_cache_retention",
    "prompt_cache_options", "prompt_cache_diagnostics",
}  # fmt: skip
# What a request that sets nothing gets, as OpenAI answers it.
OPENAI_DEFAULTS = {
    "completed_at": None,
    "truncation": "disabled",
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "max_tool_calls": None,
    "service_tier": "default",
    "safety_identifier": None,
    "user": None,
    "prompt_cache_retention": None,
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m", "comparison_response_id": None},
    "prompt_cache_diagnostics": None,
    "reasoning": {"effort": "medium", "summary": None},
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "temperature": 1.0,
    "top_p": 1.0,
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "max_output_tokens": None,
    "previous_response_id": None,
    "prompt_cache_key": None,
    "instructions": None,
    "metadata": {},
    "store": True,
    "background": False,
}


def spec_path() -> Path | None:
    configured = os.environ.get(SPEC_ENV)
    if configured:
        return Path(configured)
    return DEFAULT_SPEC if DEFAULT_SPEC.exists() else None


def require_spec() -> None:
    """Skip the calling test when the specification is not on this machine."""
    if _validators() is None:
        pytest.skip(
            f"the Open Responses specification is not here: set ${SPEC_ENV} or put it at "
            f"{DEFAULT_SPEC}"
        )


def check_response(response: dict[str, Any]) -> None:
    """A Response as sent (the body, or an event's ``response``)."""
    _validate("ResponseResource", response)


def check_item(item: dict[str, Any]) -> None:
    """An output item (``output_item.done``'s ``item``, or one of ``output``)."""
    _validate("ItemField", item)


def check_event(event: dict[str, Any]) -> None:
    """A stream event's ``data``; an event type the specification does not define is left to
    the SDK's models (``reasoning_text``, ``custom_tool_call_input`` events)."""
    name = _event_schemas().get(event.get("type"))
    if name is not None:
        _validate(name, event)


def check_compact_resource(body: dict[str, Any]) -> None:
    """A ``POST /v1/responses/compact`` answer, against the whole specification when it is
    here, else against its vendored part (so this check never skips)."""
    _check_anywhere("CompactResource", body)


def check_output_item(item: dict[str, Any]) -> None:
    """An output item (``ItemField``), as `check_item`, but never skipped: against the
    vendored part when the whole specification is not here."""
    _check_anywhere("ItemField", item)


def _check_anywhere(name: str, value: Any) -> None:
    path = spec_path()
    found = path is not None and path.exists()
    validators = _validators_at(str(path if found else COMPACT_SUBSET))
    _report(validators[name], name, value)


def available() -> bool:
    return _validators() is not None


def check_spec(response: dict[str, Any] | None = None, events: Any = ()) -> None:
    """A Response and events checked against the specification where it is on this machine."""
    if not available():
        return
    if response is not None:
        check_response(response)
    for event in events:
        check_event(event)


# --- the machinery -----------------------------------------------------------------------------


def _validate(name: str, value: Any) -> None:
    validators = _validators()
    if validators is None:
        require_spec()
        return
    _report(validators[name], name, value)


def _report(validator: jsonschema.protocols.Validator, name: str, value: Any) -> None:
    errors = sorted(validator.iter_errors(value), key=lambda error: list(error.path))
    if errors:
        details = "; ".join(
            f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
            for error in errors[:5]
        )
        raise AssertionError(f"not an Open Responses {name}: {details}")


@functools.cache
def _spec() -> dict[str, Any] | None:
    path = spec_path()
    if path is None or not path.exists():
        return None
    return _load(str(path))


@functools.cache
def _load(path: str) -> dict[str, Any]:
    """The document at ``path``, corrected and with its unions opened."""
    spec = json.loads(Path(path).read_text())
    schemas = spec["components"]["schemas"]
    if "JsonSchemaResponseFormat" in schemas:  # a vendored part may not have them
        _correct_errata(schemas)
    pristine = copy.deepcopy(schemas)  # unions are read from it while they are rewritten
    for schema in schemas.values():
        _open_unions(schema, pristine)
    return spec


@functools.cache
def _validators() -> dict[str, jsonschema.protocols.Validator] | None:
    path = spec_path()
    if path is None or not path.exists():
        return None
    return _validators_at(str(path))


@functools.cache
def _validators_at(path: str) -> dict[str, jsonschema.protocols.Validator]:
    spec = _load(path)
    resource = referencing.Resource.from_contents(
        spec, default_specification=referencing.jsonschema.DRAFT202012
    )
    registry = referencing.Registry().with_resource(_BASE, resource)
    return {
        name: jsonschema.Draft202012Validator(
            {"$ref": f"{_BASE}#/components/schemas/{name}"}, registry=registry
        )
        for name in spec["components"]["schemas"]
    }


@functools.cache
def _event_schemas() -> dict[str, str]:
    """Event type -> the name of its schema."""
    spec = _spec() or {"components": {"schemas": {}}}
    names = {}
    for name, schema in spec["components"]["schemas"].items():
        if name.endswith("StreamingEvent"):
            for event_type in schema.get("properties", {}).get("type", {}).get("enum", []):
                names[event_type] = name
    return names


def _correct_errata(schemas: dict[str, Any]) -> None:
    """Errors in the document, corrected by its own word:

    - ``JsonSchemaResponseFormat.schema`` is typed ``null``, while the request's format
      (``JsonSchemaResponseFormatParam``) gives it as an object and the Response echoes it:
      checked as the request's type.
    - ``ReasoningEffortEnum`` leaves out ``minimal``, which its own ``x-enumDescriptions``
      (and OpenAI's API) has: the described values are the enum.
    """
    request_schema = schemas["JsonSchemaResponseFormatParam"]["properties"]["schema"]
    schemas["JsonSchemaResponseFormat"]["properties"]["schema"] = copy.deepcopy(request_schema)
    effort = schemas["ReasoningEffortEnum"]
    effort["enum"] = sorted(set(effort["enum"]) | set(effort.get("x-enumDescriptions", {})))


def _open_unions(schema: Any, schemas: dict[str, Any]) -> None:
    """Rewrite each union of object schemas told apart by ``type`` (in place, recursively):
    an object whose ``type`` names none of its members passes; any other value is checked."""
    if isinstance(schema, list):
        for inner in schema:
            _open_unions(inner, schemas)
        return
    if not isinstance(schema, dict):
        return
    for value in schema.values():
        _open_unions(value, schemas)
    members = schema.get("oneOf") or schema.get("anyOf")
    if members is None and "discriminator" in schema and "$ref" in schema:
        members = [{"$ref": schema["$ref"]}]
    if not members:
        return
    known = set()
    for member in members:
        known |= _type_names(member, schemas)
    if not known:
        return
    original = {key: value for key, value in schema.items() if key != "discriminator"}
    schema.clear()
    schema["if"] = {
        "type": "object",
        "required": ["type"],
        "not": {"properties": {"type": {"enum": sorted(known)}}},
    }
    schema["then"] = True
    schema["else"] = original


def _type_names(member: dict[str, Any], schemas: dict[str, Any]) -> set[str]:
    """The ``type`` values an object member of a union accepts (none for non-objects)."""
    seen = 0
    while "$ref" in member and seen < 10:
        member = schemas[member["$ref"].rsplit("/", 1)[-1]]
        seen += 1
    names = set(member.get("properties", {}).get("type", {}).get("enum", []))
    for inner in member.get("oneOf", []) + member.get("anyOf", []):
        names |= _type_names(inner, schemas)
    return names
