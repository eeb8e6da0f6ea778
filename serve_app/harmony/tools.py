"""The tools a request offers the model, as harmony sees them.

Built once per request from ``tools``, ``tool_choice`` and the tools earlier ``tool_search``
outputs of the conversation loaded; the renderer describes these tools to the model and the
stream translator maps a harmony recipient (``functions.exec_command``,
``multi_agent_v1.close_agent``) back to the tool the client defined. Deferred tools
(``defer_loading``) are kept apart until a search loads them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from serve_app.harmony import client_tools
from serve_app.protocol import strict_schema, tool_search, tool_search_items
from serve_app.protocol.builtin_tools import BuiltinTool, CodeInterpreterTool, WebSearchTool
from serve_app.protocol.client_tools import ClientTool
from serve_app.protocol.request_tools import (
    CustomTool,
    FunctionTool,
    NamedToolChoice,
    NamespaceTool,
    ToolSearchTool,
    allowed_tools,
    client_tool_choice,
)
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.protocol.tool_search import ToolSearchOutputItem

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


# What a tool is; each kind the server runs has a runner in the tool loop (serving/tools/).
ToolKind = Literal[
    "function",
    "custom",
    "mcp",
    "mcp_approval",
    "shell",
    "local_shell",
    "apply_patch",
    "browser",
    "python",
    "tool_search",
    "tool_search_client",
]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: ToolKind
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
    # For tool_search: who answers the search, "server" or "client".
    execution: str | None = None
    # Loaded by a `tool_search_output` of the conversation: shown there, not up front.
    loaded: bool = False
    # A top-level tool marked `defer_loading`: its calls carry ``namespace`` = its name, the
    # wire shape OpenAI gives them (the Agents SDK finds deferred tools' calls by it).
    deferred_top_level: bool = False
    # An MCP server's tool it says only reads (its ``readOnlyHint``): what ``allowed_tools``
    # and ``require_approval`` filters with ``read_only`` match.
    read_only: bool = False

    @property
    def item_namespace(self) -> str | None:
        """The ``namespace`` its call items carry."""
        return self.name if self.deferred_top_level else self.namespace

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
    # Deferred tools no search of the prompt loaded: not shown; resolved (and constrained)
    # for the calls that follow a server search inside this response.
    deferred: tuple[ToolSpec, ...] = ()

    @classmethod
    def from_request(
        cls,
        request: ResponsesRequest,
        server_tools: Sequence[ToolSpec] = (),
        items: Sequence[InputItem] = (),
    ) -> ToolRegistry:
        """``server_tools``: the tools the server runs, listed before rendering (an MCP
        server's, serve_app.harmony.mcp_tools), shown after the request's own. ``items``: the
        prompt's history and input, whose ``tool_search_output`` items load tools (the
        request's own input is read when not given)."""
        choice = request.tool_choice
        if choice == "none":
            return cls()
        shown, deferred = _specs(request, items or request.input_items)
        specs = (*shown, *server_tools)
        forced = choice.name if isinstance(choice, NamedToolChoice) else None
        forced = forced or client_tool_choice(choice)
        if forced is not None:
            named = tuple(spec for spec in specs if spec.name == forced and not spec.builtin)
            return cls(named, required=True)
        allowed = allowed_tools(choice)
        if allowed is not None:
            return cls(specs, allowed.required, allowed.names, deferred)
        return cls(specs, required=choice == "required", deferred=deferred)

    def callable(self, spec: ToolSpec) -> bool:
        """Whether the model may call ``spec`` (all rendered tools, unless allowed_tools)."""
        return self.allowed is None or spec.name in self.allowed

    def namespaces(self) -> dict[str | None, list[ToolSpec]]:
        """The tools the developer message shows up front, by namespace (gpt-oss's own,
        `builtin`, are in the system message instead; tools a search loaded, where its output
        is)."""
        grouped: dict[str | None, list[ToolSpec]] = {}
        for spec in self.tools:
            if not (spec.builtin or spec.loaded):
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
        if len(matches) == 1:
            return matches[0]
        # A deferred tool a search of this response loaded (the server's search runs inside
        # the response: its registry was built before), named in full.
        return next((spec for spec in self.deferred if cleaned == spec.recipient), None)

    def builtin_kinds(self) -> set[str]:
        """Which of gpt-oss's own tools (``browser``, ``python``) the request offers."""
        return {spec.kind for spec in self.tools if spec.builtin}

    def by_name(self, name: str, namespace: str | None = None) -> ToolSpec | None:
        """The tool a call item names (``namespace`` as its items carry it)."""
        for spec in (*self.tools, *self.deferred):
            if spec.name == name and spec.item_namespace == namespace:
                return spec
        for spec in (*self.tools, *self.deferred):
            if spec.name == name and spec.namespace == namespace:
                return spec
        return None


_RECIPIENT_TAIL = re.compile(r"[\s<]")


def _specs(
    request: ResponsesRequest, items: Sequence[InputItem]
) -> tuple[tuple[ToolSpec, ...], tuple[ToolSpec, ...]]:
    """The shown tools (the request's, then those loaded by searches), and the deferred ones
    still hidden. A loaded tool the request also defines is shown as loaded (where its
    search output is), never twice."""
    shown: list[ToolSpec] = []
    deferred: list[ToolSpec] = []
    for tool in request.tools:
        if isinstance(tool, WebSearchTool | CodeInterpreterTool):
            shown.extend(spec for spec in builtin_specs(tool) if spec not in shown)
        elif isinstance(tool, ClientTool):
            shown.append(_client_spec(tool))
        elif isinstance(tool, NamespaceTool):
            for inner in tool.tools:
                spec = _spec(inner, namespace=tool.name)
                (deferred if tool.deferred(inner) else shown).append(spec)
        elif isinstance(tool, FunctionTool | CustomTool):
            if tool.defer_loading:
                deferred.append(replace(_spec(tool), deferred_top_level=True))
            else:
                shown.append(_spec(tool))
        elif isinstance(tool, ToolSearchTool):
            shown.append(_search_spec(tool, request))
    recipients = {spec.recipient for spec in shown}
    loaded = [spec for spec in loaded_specs(items) if spec.recipient not in recipients]
    loaded_recipients = {spec.recipient for spec in loaded}
    hidden = tuple(spec for spec in deferred if spec.recipient not in loaded_recipients)
    return (*shown, *_unique(loaded)), hidden


def _unique(specs: list[ToolSpec]) -> list[ToolSpec]:
    seen: set[str] = set()
    kept = []
    for spec in specs:
        if spec.recipient not in seen:
            seen.add(spec.recipient)
            kept.append(spec)
    return kept


def loaded_specs(items: Sequence[object]) -> list[ToolSpec]:
    """The tools the ``tool_search_output`` items among ``items`` loaded, in their order."""
    specs: list[ToolSpec] = []
    for item in items:
        if isinstance(item, ToolSearchOutputItem):
            specs += [
                replace(spec, loaded=True, deferred_top_level=spec.namespace is None)
                for spec in output_specs(item)
            ]
    return specs


def output_specs(item: ToolSearchOutputItem) -> list[ToolSpec]:
    """The tools one ``tool_search_output`` holds, as specs (the renderer shows them there)."""
    specs: list[ToolSpec] = []
    for tool in item.tools:
        if isinstance(tool, NamespaceTool):
            specs += [_spec(inner, namespace=tool.name) for inner in tool.tools]
        else:
            specs.append(_spec(tool))
    return specs


def _search_spec(tool: ToolSearchTool, request: ResponsesRequest) -> ToolSpec:
    """The ``tool_search`` tool as the model sees it: a function in ``functions`` listing what
    it can load (names and descriptions, as OpenAI shows deferred tools, never parameters)."""
    execution = tool.execution or "server"
    client_own = execution == "client" and tool.parameters is not None
    parameters = (
        tool.parameters
        if client_own
        else tool_search.SERVER_PARAMETERS
        if execution == "server"
        else tool_search.CLIENT_PARAMETERS
    )
    lines = tool_search.searchable_lines(request.tools)
    description = tool.description or tool_search.DEFAULT_DESCRIPTION
    if lines:
        description += "\nYou can load:\n" + "\n".join(lines)
    return ToolSpec(
        name=tool_search.TOOL_SEARCH_NAME,
        # Both are run in the tool loop: the server's search, or the client's (its call ends
        # the response, awaiting the client's `tool_search_output`).
        kind=(
            tool_search_items.SERVER_KIND
            if execution == "server"
            else tool_search_items.CLIENT_KIND
        ),
        description=description,
        parameters=parameters,
        execution=execution,
    )


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
