"""A request's `CompletionConstraint`: what its ``text.format``, tools and ``tool_choice`` ask
for, built in the ingress (the engine gets only the data, `spec`)."""

from __future__ import annotations

from serve_app.constraints.spec import FREE, Body, CompletionConstraint, ToolCallRule
from serve_app.harmony.tools import ToolRegistry, ToolSpec
from serve_app.protocol.requests import ResponsesRequest


def from_request(request: ResponsesRequest, tools: ToolRegistry) -> CompletionConstraint | None:
    """The constraint ``request`` asks for, or None where it asks for nothing enforceable
    (``tool_choice`` auto, no strict format, no strict or grammar tool). ``allowed_tools``
    leaves the other tools out of the calls the completion may end in. ``tools``: the
    request's, as the door built them (with the tools its history's searches loaded)."""
    # Deferred tools too: a server-run search loads them within the response.
    specs = (*tools.tools, *tools.deferred)
    calls = tuple(call_rule(spec) for spec in specs if tools.callable(spec))
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
