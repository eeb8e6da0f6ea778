"""Harmony's TypeScript-like text for tools and JSON schemas, as gpt-oss reads them.

gpt-oss was trained on tools described as ``namespace functions { type NAME = (_: {...}) =>
any; }``. openai-harmony 0.0.8 renders that from a JSON schema, but only a subset: ``$ref``,
``anyOf``, ``allOf``, untyped objects and non-string enums become ``any``, a union inside an
array loses its brackets, nested objects get misplaced braces and their description twice.
Pydantic and zod schemas are mostly made of those. So we render the tools section here, from a
schema ``schemas.resolve`` made self-contained, and keep harmony's exact text for what it does
render well: a flat schema renders byte for byte as harmony renders it.

The format (harmony's, extended the way TypeScript would write it):

- properties one per line, ``name?:`` when not required, descriptions (and informative titles,
  examples) as ``//`` lines above, ``// default: ...`` after;
- nested objects indented by four spaces; ``T[]`` and ``(A | B)[]`` for arrays,
  ``Record<string, T>`` for maps;
- unions on one line (``string | null``, literal enums ``"a" | "b"``), except a property whose
  ``oneOf``/``anyOf`` has several non-null variants: harmony's one-variant-per-line form;
- a recursive type by its name where it refers to itself; ``any`` for what a schema cannot say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from serve_app.protocol.json_schema import lookup, ref_name

_INDENT = "    "
_PRIMITIVES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


@dataclass(frozen=True)
class ToolText:
    name: str
    description: str
    # The resolved parameters schema; None for a tool without parameters (a freeform tool).
    parameters: Any = None


@dataclass(frozen=True)
class NamespaceText:
    name: str
    description: str | None
    tools: Sequence[ToolText]


def tools_section(namespaces: Iterable[NamespaceText]) -> str:
    """The ``# Tools`` section of harmony's developer message (namespaces sorted, as harmony
    keeps them in a sorted map)."""
    sections = ["# Tools"]
    for namespace in sorted(namespaces, key=lambda ns: ns.name):
        lines = [f"## {namespace.name}\n"]
        lines += [f"// {line}" for line in _lines(namespace.description or "")]
        lines.append(f"namespace {namespace.name} {{\n")
        for tool in namespace.tools:
            lines += [f"// {line}" for line in _lines(tool.description)]
            if tool.parameters is None:
                lines.append(f"type {tool.name} = () => any;\n")
            else:
                lines.append(f"type {tool.name} = (_: {schema_text(tool.parameters)}) => any;\n")
        lines.append(f"}} // namespace {namespace.name}")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def schema_text(schema: Any) -> str:
    """A resolved JSON schema as a TypeScript-like type, harmony's top-level form: an object's
    properties are not indented and its description stands before the brace."""
    renderer = _Renderer(schema)
    if _is_object(schema) and not _is_map(schema):
        return _comment(schema.get("description"), "") + renderer.object(schema, "", "")
    return renderer.type(schema, "")


class _Renderer:
    def __init__(self, root: Any) -> None:
        self.root = root
        # The names recursive types go by, to say which object each one is.
        self.recursive = {self._ref(pointer) for pointer in _recursive_names(root, set())}

    def type(self, schema: Any, indent: str) -> str:
        """The type of ``schema`` for a value written at ``indent`` (nested lines go deeper)."""
        if schema is False:
            return "never"
        if not isinstance(schema, dict):
            return "any"
        text = self._bare_type(schema, indent)
        if schema.get("nullable") is True and not _says_null(schema):
            text += " | null"
        return text

    def _bare_type(self, schema: dict[str, Any], indent: str) -> str:
        if isinstance(schema.get("$ref"), str):
            return self._ref(schema["$ref"])
        if "const" in schema:
            return _literal(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return " | ".join(_literal(value) for value in schema["enum"])
        variants = _variants(schema)
        if variants is not None:
            return " | ".join(self.type(variant, indent) for variant in variants) or "any"
        types = schema.get("type")
        if isinstance(types, list):
            named = [t for t in types if isinstance(t, str)]
            return " | ".join(self._typed(schema, t, indent) for t in named) or "any"
        if isinstance(types, str):
            return self._typed(schema, types, indent)
        if _is_object(schema):
            return self._typed(schema, "object", indent)
        if "items" in schema or "prefixItems" in schema:
            return self._typed(schema, "array", indent)
        return "any"

    def _typed(self, schema: dict[str, Any], kind: str, indent: str) -> str:
        if kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
        if kind == "array":
            return self._array(schema, indent)
        if kind == "object":
            if _is_map(schema):
                return f"Record<string, {self.type(schema['additionalProperties'], indent)}>"
            return self.object(schema, indent + _INDENT, indent)
        return "any"

    def _array(self, schema: dict[str, Any], indent: str) -> str:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and prefix:
            return "[" + ", ".join(self.type(item, indent) for item in prefix) + "]"
        if isinstance(items, list):  # draft-04 tuple form
            return "[" + ", ".join(self.type(item, indent) for item in items) + "]"
        if items is None or items is True:
            return "Array<any>"
        element = self.type(items, indent)
        return f"({element})[]" if _is_union(items) else f"{element}[]"

    def object(self, schema: dict[str, Any], indent: str, close: str) -> str:
        """``{ ... }`` with properties at ``indent`` and the closing brace at ``close``."""
        properties = schema.get("properties")
        required = schema.get("required")
        required = (
            {n for n in required if isinstance(n, str)} if isinstance(required, list) else set()
        )
        out = "{\n"
        if _text(schema.get("title")) and schema["title"] in self.recursive:
            out += f"{indent}// type {schema['title']} = this object\n"
        if isinstance(properties, dict):
            for name, value in properties.items():
                out += self._property(str(name), value, name in required, indent)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra and isinstance(properties, dict) and properties:
            out += f"{indent}[key: string]: {self.type(extra, indent)},\n"
        return out + f"{close}}}"

    def _property(self, name: str, schema: Any, required: bool, indent: str) -> str:
        key = f"{indent}{name}{'' if required else '?'}:"
        if not isinstance(schema, dict):
            return f"{key} {self.type(schema, indent)},\n"
        out = _title_comment(name, schema, indent)
        variants = _variants(schema)
        if variants is not None and len([v for v in variants if not _is_null(v)]) > 1:
            return out + self._union_property(key, schema, variants, indent)
        description = schema.get("description")
        if not _text(description) and variants is not None:
            # A nullable written as anyOf [T, null]: T's own description is the field's.
            description = next(
                (
                    v.get("description")
                    for v in variants
                    if isinstance(v, dict) and _text(v.get("description"))
                ),
                None,
            )
        out += _comment(description, indent) + _examples(schema, indent)
        out += f"{key} {self.type(schema, indent)},"
        if "default" in schema:
            out += f" // default: {_default(schema)}"
        return out + "\n"

    def _union_property(
        self, key: str, schema: dict[str, Any], variants: list[Any], indent: str
    ) -> str:
        """Harmony's form for a oneOf property: one `` | variant // comment`` line each."""
        description = schema.get("description") if _text(schema.get("description")) else None
        first = variants[0] if isinstance(variants[0], dict) else {}
        # Harmony says a description once when the first variant repeats the property's.
        above = description if description != first.get("description") else None
        out = _examples(schema, indent) + _comment(above, indent)
        if "default" in schema:
            out += f"{indent}// default: {_default(schema)}\n"
        out += f"{key}\n"
        for index, variant in enumerate(variants):
            out += f"{indent} | {self.type(variant, indent + '   ')}"
            trailing = []
            if isinstance(variant, dict):
                own = variant.get("description")
                if _text(own) and own != description and not (index == 0 and above):
                    trailing.append(" ".join(line for line in _lines(own) if line))
                if "default" in variant:
                    trailing.append(f"default: {_default(variant)}")
            out += f" // {' '.join(trailing)}\n" if trailing else "\n"
        return out + f"{indent},\n"

    def _ref(self, pointer: str) -> str:
        """A reference ``resolve`` left in place: a recursive type, named by its title."""
        target = lookup(self.root, pointer)
        title = target.get("title") if isinstance(target, dict) else None
        for name in (title, ref_name(pointer) if pointer != "#" else None):
            if isinstance(name, str) and _IDENTIFIER.match(name) and not name.startswith("__"):
                return name
        return "any"


def _variants(schema: dict[str, Any]) -> list[Any] | None:
    """The members of a oneOf/anyOf union; not for an object whose anyOf only combines
    constraints on its own properties."""
    if "properties" in schema:
        return None
    for keyword in ("oneOf", "anyOf"):
        value = schema.get(keyword)
        if isinstance(value, list) and value:
            return value
    return None


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _is_object(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "object":
        return True
    return (
        kind is None
        and ("properties" in schema or "additionalProperties" in schema)
        and not (_variants(schema) or "$ref" in schema or "enum" in schema or "const" in schema)
    )


def _is_map(schema: dict[str, Any]) -> bool:
    """An object that only says what its values are (``dict[str, int]``, zod's record)."""
    extra = schema.get("additionalProperties")
    return isinstance(extra, dict) and bool(extra) and not schema.get("properties")


def _is_union(schema: Any) -> bool:
    """Whether ``schema`` renders as ``A | B`` (so an array of it needs brackets)."""
    if not isinstance(schema, dict) or "$ref" in schema or "const" in schema:
        return False
    if schema.get("nullable") is True:
        return True
    if isinstance(schema.get("enum"), list):
        return len(schema["enum"]) > 1
    variants = _variants(schema)
    types = schema.get("type")
    return (variants is not None and len(variants) > 1) or (
        isinstance(types, list) and len(types) > 1
    )


def _says_null(schema: dict[str, Any]) -> bool:
    types = schema.get("type")
    variants = _variants(schema) or []
    enum = schema.get("enum")
    return (
        types == "null"
        or (isinstance(types, list) and "null" in types)
        or any(_is_null(variant) for variant in variants)
        or (isinstance(enum, list) and None in enum)
    )


def _recursive_names(schema: Any, names: set[str], depth: int = 0) -> set[str]:
    """The names of the references ``resolve`` left in place (recursive types)."""
    if depth > 64:
        return names
    if isinstance(schema, dict):
        if isinstance(schema.get("$ref"), str):
            names.add(schema["$ref"])
        for key, value in schema.items():
            if key not in ("$defs", "definitions", "enum", "const", "default", "examples"):
                _recursive_names(value, names, depth + 1)
    elif isinstance(schema, list):
        for item in schema:
            _recursive_names(item, names, depth + 1)
    return names


def _title_comment(name: str, schema: dict[str, Any], indent: str) -> str:
    """Harmony's ``// Title\\n//`` lines, unless the title only restates the property name
    (Pydantic titles every field ``Name`` for ``name``): that is noise to the model."""
    title = schema.get("title")
    if not _text(title) or _squash(title) == _squash(name):
        return ""
    return f"{indent}// {' '.join(_lines(title))}\n{indent}//\n"


def _comment(text: Any, indent: str) -> str:
    return "".join(f"{indent}// {line}\n" for line in _lines(text)) if _text(text) else ""


def _examples(schema: dict[str, Any], indent: str) -> str:
    examples = schema.get("examples")
    if not isinstance(examples, list) or not examples:
        return ""
    lines = [f'"{ex}"' if isinstance(ex, str) else _json(ex) for ex in examples]
    return f"{indent}// Examples:\n" + "".join(f"{indent}// - {line}\n" for line in lines)


def _default(schema: dict[str, Any]) -> str:
    """Harmony writes a string default in quotes, except for an enum; anything else as JSON."""
    value = schema["default"]
    if isinstance(value, str):
        return value if "enum" in schema else f'"{value}"'
    return _json(value)


def _literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else _json(value)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _lines(text: Any) -> list[str]:
    """Rust's ``str::lines``: split on newlines, drop a trailing empty line and ``\\r``."""
    if not isinstance(text, str) or not text:
        return []
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines[-1] == "" else lines


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _squash(text: str) -> str:
    return re.sub(r"[\s_\-]", "", text).lower()
