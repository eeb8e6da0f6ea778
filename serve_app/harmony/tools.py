"""The tools a request offers the model, as harmony sees them.

Built once per request from ``tools`` and ``tool_choice``; the renderer describes these tools
to the model and the stream translator maps a harmony recipient (``functions.exec_command``,
``multi_agent_v1.close_agent``) back to the tool the client defined.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from serve_app.harmony import client_tools
from serve_app.protocol import strict_schema
from serve_app.protocol.builtin_tools import BuiltinTool, CodeInterpreterTool, WebSearchTool
from serve_app.protocol.client_tools import ClientTool
from serve_app.protocol.request_tools import (
    CustomTool,
    FunctionTool,
    HostedTool,
    McpTool,
    NamedToolChoice,
    NamespaceTool,
    allowed_tools,
    client_tool_choice,
)
from serve_app.protocol.requests import ResponsesRequest

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "functions"
# The tools the client runs, shown as functions whose calls become their own items
# (serve_app.harmony.client_tools); the kind is the tool's type, and its function's name.
CLIENT_KINDS = ("shell", "local_shell", "apply_patch")

# gpt-oss's own tools (harmony/builtin.py): `browser.search|open|find` and `python`.
BROWSER_NAMESPACE = "browser"
BROWSER_ACTIONS = ("search", "open", "find")
PYTHON = "python"
BUILTIN_KINDS = ("browser", "python")


def recipient(name: str, namespace: str | None = None) -> str:
    """The harmony recipient of a tool call: ``functions.NAME`` for a top-level tool,
    ``NAMESPACE.NAME`` for one of a client's namespace tools."""
    return f"{namespace or DEFAULT_NAMESPACE}.{name}"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: Literal[
        "function",
        "custom",
        "mcp",
        "mcp_approval",
        "shell",
        "local_shell",
        "apply_patch",
        "browser",
        "python",
    ]
    description: str = ""
    parameters: dict[str, Any] | None = None
    # The client's namespace tool this belongs to; None for top-level tools.
    namespace: str | None = None
    # For custom tools: the grammar the raw-text input follows, if any, and its syntax
    # (``lark`` or ``regex``).
    grammar: str | None = None
    grammar_syntax: str | None = None
    # For function tools: the client asked for ``strict: true`` (arguments must validate).
    strict: bool = False

    @property
    def recipient(self) -> str:
        if self.kind == "python":  # gpt-oss calls it `to=python`, no namespace
            return PYTHON
        return recipient(self.name, self.namespace)

    @property
    def builtin(self) -> bool:
        """One of gpt-oss's own tools, shown in the system message (harmony/builtin.py)."""
        return self.kind in BUILTIN_KINDS


@dataclass(frozen=True)
class ToolRegistry:
    tools: tuple[ToolSpec, ...] = ()
    # Set when tool_choice is "required" or names a tool (or allowed_tools in required mode).
    required: bool = False
    # tool_choice allowed_tools: the names the model may call. Every tool is still rendered
    # (the prompt, and so its cached prefix, stays the same as the allowed set changes).
    allowed: frozenset[str] | None = None

    @classmethod
    def from_request(
        cls, request: ResponsesRequest, server_tools: Sequence[ToolSpec] = ()
    ) -> ToolRegistry:
        """``server_tools``: the tools the server runs, listed before rendering (an MCP
        server's, serve_app.harmony.mcp_tools), shown after the request's own."""
        hosted = request.hosted_tool_types()
        if hosted:
            logger.info("Leaving out hosted tools this server cannot run: %s", hosted)
        choice = request.tool_choice
        if choice == "none":
            return cls()
        specs = (*_specs(request), *server_tools)
        forced = choice.name if isinstance(choice, NamedToolChoice) else None
        forced = forced or client_tool_choice(choice)
        if forced is not None:
            named = tuple(spec for spec in specs if spec.name == forced and not spec.builtin)
            return cls(named, required=True)
        allowed = allowed_tools(choice)
        if allowed is not None:
            return cls(specs, required=allowed.required, allowed=allowed.names)
        return cls(specs, required=choice == "required")

    def callable(self, spec: ToolSpec) -> bool:
        """Whether the model may call ``spec`` (all rendered tools, unless allowed_tools)."""
        return self.allowed is None or spec.name in self.allowed

    def namespaces(self) -> dict[str | None, list[ToolSpec]]:
        """The tools the developer message shows, by namespace (gpt-oss's own, `builtin`,
        are in the system message instead)."""
        grouped: dict[str | None, list[ToolSpec]] = {}
        for spec in self.tools:
            if spec.builtin:
                continue
            grouped.setdefault(spec.namespace, []).append(spec)
        return grouped

    def resolve(self, recipient: str | None) -> ToolSpec | None:
        """The tool a harmony recipient names, tolerating the model's usual slips.

        Accepts ``functions.NAME``, ``NAMESPACE.NAME``, a bare ``NAME``, and stray text after
        the name (``functions.NAME<|constrain|>json``). Returns None for an unknown tool.
        """
        if not recipient:
            return None
        cleaned = _RECIPIENT_TAIL.split(recipient.strip(), maxsplit=1)[0]
        for spec in self.tools:
            if cleaned == spec.recipient:
                return spec
        bare = cleaned.rsplit(".", 1)[-1]
        # A bare `search` is not the browser's: gpt-oss's own tools answer their names only.
        matches = [spec for spec in self.tools if spec.name == bare and not spec.builtin]
        return matches[0] if len(matches) == 1 else None

    def builtin_kinds(self) -> set[str]:
        """Which of gpt-oss's own tools (``browser``, ``python``) the request offers."""
        return {spec.kind for spec in self.tools if spec.builtin}

    def by_name(self, name: str, namespace: str | None = None) -> ToolSpec | None:
        for spec in self.tools:
            if spec.name == name and spec.namespace == namespace:
                return spec
        return None


_RECIPIENT_TAIL = re.compile(r"[\s<]")


def _specs(request: ResponsesRequest) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for tool in request.tools:
        if isinstance(tool, HostedTool | McpTool):
            continue  # an MCP server's tools are known once listed: `server_tools`
        if isinstance(tool, WebSearchTool | CodeInterpreterTool):
            specs.extend(spec for spec in builtin_specs(tool) if spec not in specs)
        elif isinstance(tool, NamespaceTool):
            specs.extend(_spec(inner, namespace=tool.name) for inner in tool.tools)
        elif isinstance(tool, ClientTool):
            specs.append(_client_spec(tool))
        else:
            specs.append(_spec(tool))
    return specs


def enforces_strict(tool: FunctionTool) -> bool:
    """Whether ``tool``'s arguments are enforced (validate against its ``parameters``).

    ``strict: true``: yes (the schema was checked at request time); ``false``: no. Omitted: the
    Responses API "attempts to normalize your schema into strict mode when possible, and falls
    back to non-strict, best-effort function calling" otherwise (OpenAI's function-calling
    guide). We enforce a schema that already is in the strict subset and leave any other one
    best-effort, never a 400. We do not rewrite a schema into the subset as OpenAI's
    normalization does: that marks optional properties required, and the model must then
    invent values for them (clients report exactly that), which a tool may reject.
    """
    if tool.strict is not None:
        return tool.strict
    if tool.parameters is None:
        return False
    try:
        strict_schema.check_schema(tool.parameters)
    except strict_schema.StrictSchemaError:
        return False
    return True


def _client_spec(tool: ClientTool) -> ToolSpec:
    """A client-run tool as the strict function the model calls (its schema is ours, in the
    strict subset, so every call parses into the tool's item)."""
    description, parameters = client_tools.SHOWN[tool.type]
    return ToolSpec(
        name=tool.type,
        kind=tool.type,
        description=description,
        parameters=parameters,
        strict=True,
    )


def _spec(tool: FunctionTool | CustomTool, namespace: str | None = None) -> ToolSpec:
    if isinstance(tool, FunctionTool):
        return ToolSpec(
            name=tool.name,
            kind="function",
            description=tool.description or "",
            parameters=tool.parameters or {"type": "object", "properties": {}},
            namespace=namespace,
            strict=enforces_strict(tool),
        )
    grammar = syntax = None
    if tool.format is not None and tool.format.type == "grammar":
        grammar, syntax = tool.format.definition, tool.format.syntax
    return ToolSpec(
        name=tool.name,
        kind="custom",
        description=tool.description or "",
        namespace=namespace,
        grammar=grammar,
        grammar_syntax=syntax,
    )


def builtin_specs(tool: BuiltinTool) -> list[ToolSpec]:
    """gpt-oss's browser (three calls) for a web_search tool, its python for code_interpreter.
    Their descriptions are harmony's own (`SystemContent.with_browser_tool()`)."""
    if isinstance(tool, CodeInterpreterTool):
        return [ToolSpec(name=PYTHON, kind="python")]
    return [
        ToolSpec(name=action, kind="browser", namespace=BROWSER_NAMESPACE)
        for action in BROWSER_ACTIONS
    ]
