"""I-JSON numbers (RFC 7493) for constrained JSON: what a client's ``JSON.parse`` reads back.

llguidance's JSON schema compiler lets an unbounded ``number`` be any JSON number, so a
sampler may write ``-9515642952e791125262476742455271770``: valid JSON, schema-valid, and
``-Infinity`` once parsed (zod, the AI SDK's ``generateObject`` and the Agents SDK's
``outputType`` then reject the answer); an unbounded ``integer`` may be longer than a double
holds exactly. llguidance has no option for this, but it honours ``minimum`` and ``maximum``
on numbers and integers. So each number or integer a schema leaves unbounded on a side gets
that side's I-JSON bound before the schema is compiled; a bound the schema sets is kept.

The bound is ±(2^53-1) for both: the integers a double holds exactly (RFC 7493 §2.2), and
for numbers a range whose every value is a finite double. (A wider number range would be
finite too, but llguidance cannot compile a float range past about 1e18.) A value of any
type (``{}``, ``true``, an object's unlisted properties in ``json_object``) becomes the same
I-JSON value, recursively: any JSON, its numbers bounded.
"""

from __future__ import annotations

from typing import Any

# The largest integer a double holds exactly (RFC 7493 §2.2's interoperable range).
MAX_SAFE_INTEGER = 2**53 - 1
_NUMERIC = {"number", "integer"}
_ANY_VALUE = "serve_app_ijson_value"
_ANY_REF = {"$ref": f"#/$defs/{_ANY_VALUE}"}
# Keywords whose value is one schema, a list of schemas, or a map of name -> schema.
_ONE = ("not", "if", "then", "else", "contains", "propertyNames", "unevaluatedItems")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def bounded(schema: Any) -> Any:
    """``schema`` with I-JSON bounds on every number and integer it leaves unbounded, and
    values of any type made I-JSON values (a new schema; ``schema`` is not changed)."""
    if not isinstance(schema, dict):
        return schema
    state = _Walk()
    out = state.schema(schema)
    if state.any_used:
        defs = dict(out.get("$defs", {}))
        defs[_ANY_VALUE] = _any_value()
        out["$defs"] = defs
    return out


class _Walk:
    def __init__(self) -> None:
        self.any_used = False

    def schema(self, node: Any) -> Any:
        """One subschema, rewritten."""
        if node is True or node == {}:
            self.any_used = True
            return dict(_ANY_REF)
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in _ONE:
            if key in out:
                out[key] = self.schema(out[key])
        for key in _LISTS:
            if isinstance(out.get(key), list):
                out[key] = [self.schema(inner) for inner in out[key]]
        for key in _MAPS:
            if isinstance(out.get(key), dict):
                out[key] = {name: self.schema(inner) for name, inner in out[key].items()}
        items = out.get("items")
        if isinstance(items, list):
            out["items"] = [self.schema(inner) for inner in items]
        elif items is not None:
            out["items"] = self.schema(items)
        elif "array" in _types(out) and "prefixItems" not in out:
            out["items"] = self.schema({})
        extra = out.get("additionalProperties")
        if extra is not None and extra is not False:
            out["additionalProperties"] = self.schema(extra)
        elif extra is None and "object" in _types(out):
            out["additionalProperties"] = self.schema({})
        if _types(out) & _NUMERIC and "enum" not in out and "const" not in out:
            _bound(out)
        return out


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {name for name in kind if isinstance(name, str)}
    return set()


def _bound(node: dict[str, Any]) -> None:
    """The I-JSON bound on each side the schema leaves open."""
    if "minimum" not in node and "exclusiveMinimum" not in node:
        node["minimum"] = -MAX_SAFE_INTEGER
    if "maximum" not in node and "exclusiveMaximum" not in node:
        node["maximum"] = MAX_SAFE_INTEGER


def _any_value() -> dict[str, Any]:
    """Any JSON value whose numbers are I-JSON: the meaning of ``{}`` here."""
    return {
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "string"},
            {"type": "number", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER},
            {"type": "array", "items": dict(_ANY_REF)},
            {"type": "object", "additionalProperties": dict(_ANY_REF)},
        ]
    }
