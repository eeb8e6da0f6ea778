"""OpenAI's Structured Outputs rules for a ``strict: true`` schema, checked at request time.

A function tool with ``strict: true`` promises arguments that validate against its
``parameters``, and a ``text.format`` ``json_schema`` with ``strict: true`` an answer that
validates against its ``schema``. OpenAI keeps that promise only for a subset of JSON Schema
and answers 400 for a schema outside it; so do we, before rendering, so a client learns here
what OpenAI would tell it (and the constrained decoder only ever sees schemas it can enforce).
This module finds what breaks a rule (`StrictSchemaError`); the door
(serve_app.serving.admission.tools) turns it into the 400.

The subset (OpenAI's "Supported schemas"): the root is an object (not an ``anyOf``); every
object sets ``additionalProperties: false`` and lists every property in ``required`` (an
optional field is a union with ``null``); types are string, number, integer, boolean, object,
array and null, or ``enum``, ``const``, ``anyOf`` and local ``$ref``s into ``$defs``
(recursion allowed); ``allOf``, ``not``, ``dependentRequired``, ``dependentSchemas``,
``if``/``then``/``else`` are not permitted, nor ``uniqueItems`` (llguidance cannot enforce it);
at most 5,000 object properties, 10 levels of object nesting, 1,000 enum values and 120,000
characters of names and enum/const strings. Messages follow OpenAI's
(``In context=('properties', 'x'), ...``). Pure functions; tools without ``strict: true`` are
never checked (Codex and the AI SDK send ``strict: false`` with free-form schemas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve_app.protocol import json_schema as schemas

MAX_PROPERTIES = 5000
MAX_NESTING = 10
MAX_ENUM_VALUES = 1000
MAX_STRING_CHARS = 120_000
# A string enum with more values than this may hold at most MAX_LARGE_ENUM_CHARS characters.
LARGE_ENUM_VALUES = 250
MAX_LARGE_ENUM_CHARS = 15_000

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
NOT_PERMITTED = (
    "allOf",
    "not",
    "dependentRequired",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "uniqueItems",
)
_DEFINITIONS = ("$defs", "definitions")

Context = tuple[str, ...]


class StrictSchemaError(ValueError):
    """A schema outside the strict subset; ``context`` is the path to the offending schema."""

    def __init__(self, context: Context, detail: str) -> None:
        super().__init__(f"In context={context!r}, {detail}")
        self.context = context
        self.detail = detail


def check_schema(schema: Any) -> None:
    """Raise `StrictSchemaError` where ``schema`` breaks a strict-mode rule."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or "anyOf" in schema:
        got = schema.get("type") if isinstance(schema, dict) else None
        raise StrictSchemaError(
            (), f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{got}\"'."
        )
    walk = _Walk(root=schema)
    walk.schema(schema, ())
    walk.check_totals()
    _check_nesting(schemas.resolve(schema))


@dataclass
class _Walk:
    """One pass over the schema as written: each rule where it applies, and the totals."""

    root: dict[str, Any]
    properties: int = 0
    enum_values: int = 0
    string_chars: int = 0

    def schema(self, node: Any, context: Context) -> None:
        if not isinstance(node, dict):
            raise StrictSchemaError(context, "schema must be a JSON object.")
        for keyword in NOT_PERMITTED:
            if keyword in node:
                raise StrictSchemaError(context, f"'{keyword}' is not permitted.")
        for key in _DEFINITIONS:
            self._definitions(node.get(key), (*context, key))
        self._values(node, context)
        if "$ref" in node:
            self._reference(node["$ref"], context)
        elif "anyOf" in node:
            self._any_of(node["anyOf"], context)
        else:
            self._typed(node, context)

    def check_totals(self) -> None:
        if self.properties > MAX_PROPERTIES:
            raise StrictSchemaError(
                (), f"too many object properties: {self.properties} > {MAX_PROPERTIES}."
            )
        if self.enum_values > MAX_ENUM_VALUES:
            raise StrictSchemaError(
                (), f"too many enum values: {self.enum_values} > {MAX_ENUM_VALUES}."
            )
        if self.string_chars > MAX_STRING_CHARS:
            raise StrictSchemaError(
                (),
                "the total length of property names, definition names, enum values and const"
                f" values is {self.string_chars} characters, more than {MAX_STRING_CHARS}.",
            )

    def _definitions(self, definitions: Any, context: Context) -> None:
        if definitions is None:
            return
        if not isinstance(definitions, dict):
            raise StrictSchemaError(context, "definitions must be a JSON object.")
        for name, definition in definitions.items():
            self.string_chars += len(name)
            self.schema(definition, (*context, name))

    def _reference(self, pointer: Any, context: Context) -> None:
        # The target is checked where it is written ($defs, or the root for "#").
        if not isinstance(pointer, str) or not isinstance(schemas.lookup(self.root, pointer), dict):
            raise StrictSchemaError(
                context, f"reference to component '{pointer}' which was not found in the schema."
            )

    def _any_of(self, branches: Any, context: Context) -> None:
        if not isinstance(branches, list) or not branches:
            raise StrictSchemaError(context, "'anyOf' must be a non-empty array of schemas.")
        for index, branch in enumerate(branches):
            self.schema(branch, (*context, "anyOf", str(index)))

    def _values(self, node: dict[str, Any], context: Context) -> None:
        """Count enum and const values towards the limits."""
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values:
                raise StrictSchemaError(context, "'enum' must be a non-empty array.")
            self.enum_values += len(values)
            chars = sum(len(value) for value in values if isinstance(value, str))
            self.string_chars += chars
            if len(values) > LARGE_ENUM_VALUES and chars > MAX_LARGE_ENUM_CHARS:
                raise StrictSchemaError(
                    context,
                    f"an enum of more than {LARGE_ENUM_VALUES} values may hold at most"
                    f" {MAX_LARGE_ENUM_CHARS} characters; this one holds {chars}.",
                )
        if isinstance(node.get("const"), str):
            self.string_chars += len(node["const"])

    def _typed(self, node: dict[str, Any], context: Context) -> None:
        declared = node.get("type")
        if declared is None:
            if "enum" in node or "const" in node:
                return
            raise StrictSchemaError(context, "schema must have a 'type' key.")
        types = declared if isinstance(declared, list) else [declared]
        for name in types:
            if name not in TYPES:
                raise StrictSchemaError(context, f"type {name!r} is not supported.")
        if "object" in types:
            self._object(node, context)
        if "array" in types:
            if "items" not in node:
                raise StrictSchemaError(context, "array schema missing items.")
            self.schema(node["items"], (*context, "items"))

    def _object(self, node: dict[str, Any], context: Context) -> None:
        if node.get("additionalProperties") is not False:
            raise StrictSchemaError(
                context, "'additionalProperties' is required to be supplied and to be false."
            )
        properties = node.get("properties", {})
        required = node.get("required", [])
        if not isinstance(properties, dict):
            raise StrictSchemaError(context, "'properties' must be a JSON object.")
        if not isinstance(required, list):
            required = []
        missing = [name for name in properties if name not in required]
        if missing:
            raise StrictSchemaError(
                context,
                "'required' is required to be supplied and to be an array including every key"
                f" in properties. Missing '{missing[0]}'.",
            )
        extra = [name for name in required if name not in properties]
        if extra:
            raise StrictSchemaError(context, f"Extra required key '{extra[0]}' supplied.")
        self.properties += len(properties)
        for name, value in properties.items():
            self.string_chars += len(name)
            self.schema(value, (*context, "properties", name))


def _check_nesting(resolved: Any) -> None:
    """At most MAX_NESTING levels of objects, the root being the first, counted on the schema
    with its references inlined (a recursive reference stays a reference: it nests no deeper
    here, as recursion is allowed)."""
    stack: list[tuple[Any, Context, int]] = [(resolved, (), 0)]
    while stack:
        node, context, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        declared = node.get("type")
        types = declared if isinstance(declared, list) else [declared]
        if "properties" in node or "object" in types:
            depth += 1
            if depth > MAX_NESTING:
                raise StrictSchemaError(
                    context, f"the schema nests objects more than {MAX_NESTING} levels deep."
                )
        properties = node.get("properties")
        if isinstance(properties, dict):
            for name, child in properties.items():
                stack.append((child, (*context, "properties", name), depth))
        if "items" in node:
            stack.append((node["items"], (*context, "items"), depth))
        branches = node.get("anyOf")
        if isinstance(branches, list):
            for index, branch in enumerate(branches):
                stack.append((branch, (*context, "anyOf", str(index)), depth))
