"""At request time: every schema or grammar a request asks to enforce must compile.

A strict schema inside OpenAI's subset can still hold what llguidance cannot enforce (a
``pattern`` with look-around), and a custom tool's grammar can be malformed. Both engines would
fail the request later (the simulated engine's matcher, vLLM's grammar compile); this finds
it (`first_unenforceable`), and the door (serve_app.serving.admission.tools) answers a 400
naming the param, before anything is rendered or queued. llguidance validates a grammar
without a vocabulary in about a millisecond, and each distinct body is checked once per process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llguidance

from serve_app.constraints.build import call_rule, final_body
from serve_app.constraints.grammar import to_lark
from serve_app.constraints.spec import Body, CompletionConstraint
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.request_tools import CustomTool, FunctionTool, NamespaceTool
from serve_app.protocol.requests import ResponsesRequest

_CACHE_SIZE = 1024


@dataclass(frozen=True)
class Unenforceable:
    """A schema or grammar the engine could not enforce: where it is, and llguidance's word."""

    param: str
    code: str
    error: str


def first_unenforceable(request: ResponsesRequest, tools: ToolRegistry) -> Unenforceable | None:
    """The first schema or grammar of the request that does not compile, or None."""
    checks: list[tuple[Body, str, str]] = []
    body = final_body(request)
    if not body.free:
        checks.append((body, "text.format.schema", "invalid_json_schema"))
    params = _tool_params(request)
    for spec in (*tools.tools, *tools.deferred):
        if not tools.callable(spec):
            continue
        rule_body = call_rule(spec).body
        if rule_body.free:
            continue
        prefix = params.get((spec.namespace, spec.name), "tools")
        if spec.kind != "custom":  # a function, or a client-run tool's (our own schema)
            checks.append((rule_body, f"{prefix}.parameters", "invalid_function_parameters"))
        else:
            checks.append((rule_body, f"{prefix}.format.definition", "invalid_grammar"))
    for checked, param, code in checks:
        if error := _compile_error(checked):
            return Unenforceable(param, code, error)
    return None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compile_error(body: Body) -> str:
    """llguidance's error for ``body`` ("" when it compiles), first line only: the rest is the
    grammar text around it, ours rather than the client's."""
    grammar = to_lark(CompletionConstraint(final=body))
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    return " ".join(line.strip() for line in error.splitlines()[:4] if line.strip())


def _tool_params(request: ResponsesRequest) -> dict[tuple[str | None, str], str]:
    """Where each tool sits in the request (``tools[2]``, ``tools[0].tools[1]``)."""
    params: dict[tuple[str | None, str], str] = {}
    for index, tool in enumerate(request.tools):
        if isinstance(tool, FunctionTool | CustomTool):
            params[(None, tool.name)] = _param(tool, f"tools[{index}]")
        elif isinstance(tool, NamespaceTool):
            for inner_index, inner in enumerate(tool.tools):
                param = _param(inner, f"tools[{index}].tools[{inner_index}]")
                params[(tool.name, inner.name)] = param
    return params


def _param(tool: FunctionTool | CustomTool, prefix: str) -> str:
    # A Chat-Completions form tool's fields sit under `function`.
    if isinstance(tool, FunctionTool) and tool.chat_form:
        return f"{prefix}.function"
    return prefix
