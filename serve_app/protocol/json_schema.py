"""Resolve a client's JSON schema into one self-contained schema.

Clients write tool parameters and ``text.format`` schemas with local references: Pydantic puts
nested models in ``$defs`` and points at them with ``$ref``, older generators wrap a reference in
``allOf``, zod names reused or recursive types ``__schema0`` or points back at the root with
``"#"``. A reader that walks the schema (the prompt renderer, later a constrained decoder) wants
them inlined. ``resolve`` returns an equivalent schema where:

- every local ``$ref`` (``#``, ``#/$defs/X``, ``#/definitions/X``, any JSON pointer) is replaced
  by a copy of its target, the keywords written next to the ``$ref`` winning over the target's;
- ``allOf`` is merged into its parent (properties and ``required`` combined);
- a ``$ref`` back into a definition being expanded (a recursive type) is left as a ``$ref``, and
  the root keeps its ``$defs``/``definitions`` so the result stays a valid schema;
- anything past ``max_depth`` levels or a total of ``max_nodes`` schemas becomes ``{}`` (any), so a
  hostile or exponential schema costs bounded time; an unresolvable reference becomes ``{}`` too.

Pure functions on JSON values; never raises on a weird schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 24
MAX_NODES = 4000

# Keywords whose value is one schema, a list of schemas, or a map of name -> schema. Everything
# else (enum, const, default, examples, ...) is data and is copied untouched.
_SCHEMA_KEYWORDS = (
    "items",
    "additionalProperties",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_LIST_KEYWORDS = ("anyOf", "oneOf", "prefixItems")
_MAP_KEYWORDS = ("properties", "patternProperties", "dependentSchemas")
_DEFINITIONS = ("$defs", "definitions")


@dataclass
class _Walk:
    root: Any
    max_depth: int
    budget: int
    # Pointers being expanded, innermost last: a $ref to one of them is a cycle.
    expanding: list[str] = field(default_factory=list)
    cyclic: bool = False


def resolve(schema: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """``schema`` with local references inlined and ``allOf`` merged (see the module docstring)."""
    # The root is being expanded from the start: zod writes a recursive root as {"$ref": "#"}.
    walk = _Walk(root=schema, max_depth=max_depth, budget=max_nodes, expanding=["#"])
    resolved = _resolve(schema, walk, depth=0)
    if walk.cyclic and isinstance(schema, dict) and isinstance(resolved, dict):
        # The $refs left for recursive types point into the original definitions.
        for key in _DEFINITIONS:
            if key in schema:
                resolved[key] = schema[key]
    return resolved


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply JSON ``value`` nests objects and arrays, counted up to ``limit + 1`` (without
    recursion, so any depth is safe to measure)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list) or depth > limit + 1:
            continue
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children)
    return deepest


def ref_name(pointer: str) -> str:
    """The last segment of a local reference: ``#/$defs/TreeNode`` -> ``TreeNode``."""
    segment = pointer.rsplit("/", 1)[-1]
    return segment.replace("~1", "/").replace("~0", "~")


def lookup(root: Any, pointer: str) -> Any:
    """The value a local JSON pointer (``#/a/b``) names in ``root``, or None."""
    if not pointer.startswith("#"):
        return None
    node = root
    for raw in [part for part in pointer[1:].split("/") if part]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _resolve(schema: Any, walk: _Walk, depth: int) -> Any:
    if not isinstance(schema, dict):
        return schema  # true/false schemas, or junk a reader treats as any
    walk.budget -= 1
    if depth > walk.max_depth or walk.budget < 0:
        return {}
    if isinstance(schema.get("$ref"), str):
        return _resolve_ref(schema, walk, depth)
    resolved = {
        key: _resolve_keyword(key, value, walk, depth)
        for key, value in schema.items()
        if key not in _DEFINITIONS and key != "allOf"
    }
    if isinstance(schema.get("allOf"), list):
        parts = [_resolve(part, walk, depth + 1) for part in schema["allOf"]]
        resolved = _merge_all_of(resolved, parts)
    return resolved


def _resolve_keyword(key: str, value: Any, walk: _Walk, depth: int) -> Any:
    if key in _SCHEMA_KEYWORDS:
        if isinstance(value, list):  # draft-04 tuple form of items
            return [_resolve(item, walk, depth + 1) for item in value]
        return _resolve(value, walk, depth + 1)
    if key in _LIST_KEYWORDS and isinstance(value, list):
        return [_resolve(item, walk, depth + 1) for item in value]
    if key in _MAP_KEYWORDS and isinstance(value, dict):
        return {name: _resolve(item, walk, depth + 1) for name, item in value.items()}
    return value


def _resolve_ref(schema: dict[str, Any], walk: _Walk, depth: int) -> Any:
    pointer = schema["$ref"]
    siblings = {key: value for key, value in schema.items() if key != "$ref"}
    if pointer in walk.expanding:
        walk.cyclic = True
        return {"$ref": pointer, **siblings}
    target = lookup(walk.root, pointer)
    if not isinstance(target, dict):
        # A remote or dangling reference: say nothing rather than guess.
        return _resolve(siblings, walk, depth)
    walk.expanding.append(pointer)
    try:
        inlined = _resolve(target, walk, depth + 1)
    finally:
        walk.expanding.pop()
    if not isinstance(inlined, dict):
        return inlined
    return {**inlined, **_resolve(siblings, walk, depth)}


def _merge_all_of(base: dict[str, Any], parts: list[Any]) -> dict[str, Any]:
    """One schema for ``{...base, allOf: parts}``: what each part says, ``base`` winning."""
    merged: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for part in [*parts, base]:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("properties"), dict):
            properties.update(part["properties"])
        if isinstance(part.get("required"), list):
            required.extend(name for name in part["required"] if name not in required)
        merged.update(
            {key: value for key, value in part.items() if key not in ("properties", "required")}
        )
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged
