"""What a completion must obey, engine-neutral: built by the ingress from the request.

Harmony's structure decides where a constraint applies. The analysis channel (and, where tools
are offered, commentary preambles) stays free; the message that ends the completion is
constrained: a ``final`` message (``<|return|>``) whose body may have to be JSON matching the
``text.format`` schema, or one tool call (``<|call|>``, a stop token: one call per completion)
whose body may have to match the tool's parameters or grammar. ``tool_choice`` decides which of
those endings are allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from serve_app.harmony.tools import ToolRegistry, ToolSpec
from serve_app.protocol.requests import ResponsesRequest

BodyKind = Literal["text", "json", "lark", "regex"]


@dataclass(frozen=True)
class Body:
    """A message body: free text, JSON matching a schema, or text matching a grammar."""

    kind: BodyKind = "text"
    # The JSON schema as compact JSON text (hashable, one cache key per distinct schema), or
    # the lark / regex grammar text. Keys keep the client's order: llguidance writes an
    # object's properties in the order the schema lists them (as OpenAI's strict mode does),
    # so sorting them would force alphabetical keys on the model.
    source: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Body:
        return cls("json", json.dumps(schema, separators=(",", ":")))

    @property
    def free(self) -> bool:
        return self.kind == "text"


FREE = Body()


@dataclass(frozen=True)
class ToolCallRule:
    """One tool the completion may end by calling."""

    recipient: str  # functions.NAME, or NAMESPACE.NAME for a namespace tool
    kind: Literal["function", "custom"]
    body: Body = FREE


@dataclass(frozen=True)
class CompletionConstraint:
    """The endings a completion may have; everything before them is free harmony messages."""

    # The final answer's body; None when the completion must end in a tool call.
    final: Body | None
    tool_calls: tuple[ToolCallRule, ...] = ()

    @property
    def preambles(self) -> bool:
        """Commentary without a recipient (a preamble to tool calls) only where tools are."""
        return bool(self.tool_calls)


def from_request(
    request: ResponsesRequest, tools: ToolRegistry | None = None
) -> CompletionConstraint | None:
    """The constraint ``request`` asks for, or None where it asks for nothing enforceable
    (``tool_choice`` auto, no strict format, no strict or grammar tool). ``allowed_tools``
    leaves the other tools out of the calls the completion may end in."""
    tools = tools or ToolRegistry.from_request(request)
    calls = tuple(call_rule(spec) for spec in tools.tools if tools.callable(spec))
    final = None if tools.required and calls else final_body(request)
    constraint = CompletionConstraint(final=final, tool_calls=calls)
    # allowed_tools restricts which tools may be called even when none is strict.
    restricts = tools.required or tools.allowed is not None or request.tool_choice == "none"
    if not restricts and _all_free(constraint):
        return None
    return constraint


def final_body(request: ResponsesRequest) -> Body:
    text_format = request.text.format if request.text else None
    if text_format is None:
        return FREE
    if text_format.type == "json_object":
        return Body.json_schema({"type": "object"})
    if text_format.type == "json_schema" and text_format.strict:
        return Body.json_schema(text_format.schema_ or {})
    return FREE


def call_rule(spec: ToolSpec) -> ToolCallRule:
    if spec.kind == "custom":
        return ToolCallRule(spec.recipient, "custom", _grammar_body(spec))
    if spec.strict:
        return ToolCallRule(spec.recipient, "function", Body.json_schema(spec.parameters or {}))
    return ToolCallRule(spec.recipient, "function")


def _grammar_body(spec: ToolSpec) -> Body:
    if spec.grammar is None:
        return FREE
    syntax = spec.grammar_syntax or "lark"
    return Body("regex" if syntax == "regex" else "lark", spec.grammar)


def _all_free(constraint: CompletionConstraint) -> bool:
    bodies = [constraint.final] + [call.body for call in constraint.tool_calls]
    return all(body is None or body.free for body in bodies)
