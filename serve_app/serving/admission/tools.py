"""The rules on a request's tools, tool calls and schemas: every tool of a type this server
shows or runs (serve_app.protocol.tool_types, the table; any other is a 400 naming
``tools[i].type``), every tool call paired with its
output, a ``tool_choice`` that names tools the request defines, tool parameters harmony can
take, strict schemas inside OpenAI's subset (serve_app.protocol.strict_schema finds what breaks
it), and schemas and grammars constrained decoding can enforce (serve_app.constraints.validate
finds what does not compile)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from serve_app.config import AppArgs
from serve_app.constraints.validate import first_unenforceable
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol import json_schema
from serve_app.protocol.client_tools import ClientTool, ShellTool
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.request_tools import (
    CustomTool,
    FunctionTool,
    NamedToolChoice,
    NamespaceTool,
    OmittedTool,
    OtherToolChoice,
    ToolSearchTool,
    allowed_tools,
    client_tool_choice,
    omitted_types,
)
from serve_app.protocol.requests import (
    InputItem,
    ResponsesRequest,
    ToolCallItem,
    ToolOutputItem,
)
from serve_app.protocol.strict_schema import StrictSchemaError, check_schema
from serve_app.protocol.tool_types import TOOL_TYPES, accepted, missing, omitted
from serve_app.serving import metrics

# Tool parameters nested deeper than this were a 400 when harmony parsed them (its JSON parser's
# recursion limit); they stay one: the response could not echo much deeper ones back anyway.
MAX_PARAMETERS_NESTING = 120

logger = logging.getLogger(__name__)


def check_tool_types(args: AppArgs, request: ResponsesRequest) -> None:
    """Every tool is of a type shown or run here: OpenAI's 400 for a model lacking the tool
    (its words: "Tool 'image_generation' is not supported with gpt-5.3-codex-spark."), or for
    a type OpenAI does not define, naming ``tools[i].type``. Deferred tools need a
    ``tool_search`` tool to be found by; a ``tool_search`` tool, at most one."""
    searches = 0
    for index, tool in enumerate(request.tools):
        param = f"tools[{index}].type"
        if tool.type not in TOOL_TYPES:
            supported = ", ".join(f"'{name}'" for name in TOOL_TYPES)
            raise InvalidRequest(
                f"Invalid value: '{tool.type}'. Supported values are: {supported}.",
                param=param,
                code="invalid_value",
            )
        if isinstance(tool, OmittedTool):
            continue
        if not accepted(tool.type, args):
            raise InvalidRequest(_unsupported(tool.type, request.model, args), param=param)
        searches += isinstance(tool, ToolSearchTool)
    if searches > 1:
        raise InvalidRequest("At most one 'tool_search' tool is allowed.", param="tools")
    deferred = _first_deferred(request)
    if deferred is not None and not searches:
        raise InvalidRequest(
            "Deferred tools (`defer_loading: true`) can only be found with a 'tool_search' "
            "tool in 'tools'.",
            param=deferred,
        )


def _unsupported(tool_type: str, model: str, args: AppArgs) -> str:
    """OpenAI's words for a tool the model lacks, with what the operator lacks and what the
    client can do instead, where the table says."""
    message = f"Tool '{tool_type}' is not supported with {model}"
    needs = missing(tool_type, args)
    if not needs:
        return message + "."
    message += f": this server has no {needs}."
    remedy = TOOL_TYPES[tool_type].client_remedy
    return message + (f" To be served without it, {remedy}." if remedy else "")


def omit_unavailable(args: AppArgs, request: ResponsesRequest) -> ResponsesRequest:
    """``request`` with each tool this deployment cannot run but serves without (tool_types.py,
    `omitted`) replaced by an `OmittedTool`, so every later step (the checks, the tools the
    model is shown, the system message, the echo) sees it left out. Counted per type."""
    if not any(omitted(tool.type, args) for tool in request.tools):
        return request
    tools: list[Any] = []
    for tool in request.tools:
        if omitted(tool.type, args):
            sent = tool.model_dump(exclude_none=True, by_alias=True)
            note = TOOL_TYPES[tool.type].unavailable_note
            tool = OmittedTool(type=tool.type, sent=sent, note=note)
        tools.append(tool)
    for tool_type in omitted_types(tools):
        metrics.TOOLS_OMITTED.labels(tool_type).inc()
        _log_first_omission(tool_type, args)
    return request.model_copy(update={"tools": tools})


_LOGGED_OMISSIONS: set[str] = set()


def _log_first_omission(tool_type: str, args: AppArgs) -> None:
    """Once per type and process: the operator learns clients send a tool served without."""
    if tool_type in _LOGGED_OMISSIONS:
        return
    _LOGGED_OMISSIONS.add(tool_type)
    logger.warning(
        "Requests with a %r tool are served without it: this server has no %s (set "
        "tools.web_search_without_browser: refuse to answer them 400 instead); "
        "serve_app_tools_omitted_total counts them",
        tool_type,
        missing(tool_type, args),
    )


def _first_deferred(request: ResponsesRequest) -> str | None:
    """The param of the request's first deferred tool, if any."""
    for index, tool in enumerate(request.tools):
        if isinstance(tool, FunctionTool | CustomTool) and tool.defer_loading:
            return f"tools[{index}].defer_loading"
        if isinstance(tool, NamespaceTool):
            if tool.defer_loading:
                return f"tools[{index}].defer_loading"
            for inner_index, inner in enumerate(tool.tools):
                if inner.defer_loading:
                    return f"tools[{index}].tools[{inner_index}].defer_loading"
    return None


# A hosted `tool_choice` type and the tool types it picks (OpenAI's ToolChoiceTypes names the
# preview and computer-use types loosely).
_CHOICE_TYPES = {
    "web_search_preview": ("web_search_preview", "web_search_preview_2025_03_11"),
    "computer_use": ("computer_use_preview", "computer"),
    "computer": ("computer", "computer_use_preview"),
}


def check_hosted_tool_choice(args: AppArgs, request: ResponsesRequest) -> None:
    """A ``tool_choice`` naming a hosted type (``{"type": "file_search"}``, ``mcp``,
    ``shell``...) needs a tool of that type in ``tools``, as a named function choice does, and
    one this server runs (not one it serves the request without)."""
    choice = request.tool_choice
    if not isinstance(choice, OtherToolChoice) or choice.type == "allowed_tools":
        return
    wanted = _CHOICE_TYPES.get(choice.type, (choice.type,))
    chosen = [tool for tool in request.tools if tool.type in wanted]
    if not chosen:
        raise InvalidRequest(
            f"Tool choice '{choice.type}' not found in 'tools' parameter.", param="tool_choice"
        )
    if all(isinstance(tool, OmittedTool) for tool in chosen):
        # Served without it, it cannot be the tool the model must call.
        raise InvalidRequest(_unsupported(chosen[0].type, request.model, args), param="tool_choice")


def check_tool_call_pairs(items: Sequence[InputItem], first_input: int = 0) -> None:
    """Every tool call needs its output and every output its call, as OpenAI requires.
    ``items[first_input:]`` are the request's own input; earlier ones, the history it continues.
    Errors name the request's own item (``input[i]``), or ``input`` for a call in the history
    that the input leaves without its output."""

    def param(index: int) -> str:
        return f"input[{index - first_input}].call_id" if index >= first_input else "input"

    calls: dict[str, int] = {}
    outputs: dict[str, int] = {}
    for index, item in enumerate(items):
        if isinstance(item, ToolCallItem):
            calls.setdefault(item.call_id, index)
        elif isinstance(item, ToolOutputItem):
            if item.call_id not in calls:
                raise InvalidRequest(
                    f"No tool call found for function call output with call_id {item.call_id}.",
                    param=param(index),
                )
            outputs.setdefault(item.call_id, index)
    for call_id, index in calls.items():
        if call_id not in outputs:
            raise InvalidRequest(
                f"No tool output found for function call {call_id}.",
                param=param(index),
            )


def check_client_tools(request: ResponsesRequest) -> None:
    """The client-run tools are ones this server can show: a ``shell`` in the client's own
    (``local``) environment, not in a container OpenAI would host; each at most once, and no
    function of the same name beside it (the model calls it as that function). A
    ``computer_use_preview`` tool is refused: its outputs are screenshots, which gpt-oss, a
    text-only model, cannot see."""
    for index, tool in enumerate(request.tools):
        if tool.type == "computer_use_preview":
            raise InvalidRequest(
                "Tool 'computer_use_preview' is not supported with this model: the computer "
                "tool's outputs are screenshots, and gpt-oss reads text only.",
                param=f"tools[{index}].type",
                code="unsupported_value",
            )
        if isinstance(tool, ShellTool) and tool.environment and tool.environment.type != "local":
            raise InvalidRequest(
                f"Shell environment '{tool.environment.type}' is not supported: this server "
                "hosts no containers; the shell tool runs in the client's local environment "
                "({'type': 'local'}).",
                param=f"tools[{index}].environment.type",
                code="unsupported_value",
            )
    _check_client_tool_names(request)


def _check_client_tool_names(request: ResponsesRequest) -> None:
    """A client-run tool is the function of its type's name: no other tool may take it."""
    client = {index for index, tool in enumerate(request.tools) if isinstance(tool, ClientTool)}
    first: dict[str, int] = {}
    for index, tool in enumerate(request.tools):
        if isinstance(tool, ClientTool):
            name = tool.type
        elif isinstance(tool, FunctionTool | CustomTool):
            name = tool.name
        else:
            continue
        taken = first.setdefault(name, index)
        if taken != index and (taken in client or index in client):
            raise InvalidRequest(
                f"Tool '{name}' is defined twice (tools[{taken}] and tools[{index}]): the "
                f"{name} tool is shown to the model as a function named '{name}'.",
                param=f"tools[{index}]",
            )


def check_tool_choice(request: ResponsesRequest) -> None:
    """An ``allowed_tools`` choice is well formed, and a named tool_choice (or each tool an
    ``allowed_tools`` choice names) is a tool the request defines."""
    choice = request.tool_choice
    if isinstance(choice, OtherToolChoice) and choice.type == "allowed_tools":
        _check_allowed_tools(choice.model_extra or {})
    allowed = allowed_tools(choice)
    forced = client_tool_choice(choice)
    if not isinstance(choice, NamedToolChoice) and allowed is None and forced is None:
        return
    names = set()
    for tool in request.tools:
        if isinstance(tool, FunctionTool | CustomTool):
            names.add(tool.name)
        elif isinstance(tool, NamespaceTool):
            names.update(inner.name for inner in tool.tools)
        elif isinstance(tool, ClientTool):
            names.add(tool.type)
    wanted = sorted(allowed.names) if allowed is not None else [forced or _choice_name(choice)]
    for name in wanted:
        if name not in names:
            raise InvalidRequest(
                f"Tool choice '{name}' not found in 'tools' parameter.", param="tool_choice"
            )


def _check_allowed_tools(extra: dict[str, Any]) -> None:
    """``tool_choice: {"type": "allowed_tools", ...}``: a mode, and an array of tools each
    with a `type` (and a `name` for function and custom tools); a 400 naming the field."""
    if extra.get("mode") not in ("auto", "required"):
        raise InvalidRequest(
            "tool_choice.mode must be 'auto' or 'required'.", param="tool_choice.mode"
        )
    tools = extra.get("tools")
    if not isinstance(tools, list):
        raise InvalidRequest("tool_choice.tools must be an array.", param="tool_choice.tools")
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise InvalidRequest(
                "Each allowed tool is an object with a `type`.",
                param=f"tool_choice.tools[{index}]",
            )
        if tool["type"] in ("function", "custom") and not isinstance(tool.get("name"), str):
            raise InvalidRequest(
                f"An allowed {tool['type']} tool needs a string `name`.",
                param=f"tool_choice.tools[{index}].name",
            )


def _choice_name(choice: object) -> str:
    return choice.name if isinstance(choice, NamedToolChoice) else ""


def check_tool_parameters(tools: ToolRegistry) -> None:
    for spec in (*tools.tools, *tools.deferred):
        if spec.parameters is not None:  # a function's, or a client's tool_search's
            depth = json_schema.nesting_depth(spec.parameters, MAX_PARAMETERS_NESTING)
            if depth > MAX_PARAMETERS_NESTING:
                raise InvalidRequest(
                    f"The parameters of tool '{spec.name}' nest deeper than "
                    f"{MAX_PARAMETERS_NESTING} levels.",
                    param="tools",
                )


def check_strict_schemas(request: ResponsesRequest) -> None:
    """A strict schema OpenAI would refuse is a 400 here, not a promise we cannot keep: the
    first strict function tool or strict ``json_schema`` format whose schema breaks a rule,
    naming its param (``tools[2].parameters``, ``text.format.schema``)."""
    for index, tool in enumerate(request.tools):
        if isinstance(tool, FunctionTool):
            _check_strict_tool(tool, f"tools[{index}]")
        elif isinstance(tool, NamespaceTool):
            for inner_index, inner in enumerate(tool.tools):
                if isinstance(inner, FunctionTool):
                    _check_strict_tool(inner, f"tools[{index}].tools[{inner_index}]")
    text_format = request.text.format if request.text else None
    if (
        text_format is not None
        and text_format.type == "json_schema"
        and text_format.strict is True
        and text_format.schema_ is not None
    ):
        name = text_format.name or "response_format"
        _check_strict(text_format.schema_, f"response_format '{name}'", "text.format.schema")


def _check_strict_tool(tool: FunctionTool, prefix: str) -> None:
    if tool.strict is not True or tool.parameters is None:
        return
    prefix = f"{prefix}.function" if tool.chat_form else prefix
    _check_strict(tool.parameters, f"function '{tool.name}'", f"{prefix}.parameters")


def _check_strict(schema: dict[str, Any], owner: str, param: str) -> None:
    try:
        check_schema(schema)
    except StrictSchemaError as error:
        code = "invalid_json_schema" if param.startswith("text.") else "invalid_function_parameters"
        raise InvalidRequest(
            f"Invalid schema for {owner}: {error}", param=param, code=code
        ) from None


def check_enforceable(request: ResponsesRequest, tools: ToolRegistry) -> None:
    """Every schema or grammar the request asks to enforce compiles: a 400 naming the param
    the engine could not enforce."""
    found = first_unenforceable(request, tools)
    if found is not None:
        raise InvalidRequest(
            f"Invalid {found.param}: constrained decoding cannot enforce it: {found.error}",
            param=found.param,
            code=found.code,
        )
