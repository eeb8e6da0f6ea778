"""Builders of ``openai.types.responses`` objects that know nothing of harmony.

Every field of OpenAI's Response object is set explicitly, with the request's value or OpenAI's
default, nulls included where the specification makes the field nullable (``error``,
``completed_at``, ``max_tool_calls``...): the SSE encoder and the non-streaming endpoint dump
with ``exclude_unset``, so what is set here is exactly what goes on the wire, as OpenAI sends
it. Fields the specification does not let be null are left out rather than sent as null.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from openai.types.responses import (
    Response,
    ResponseTextConfig,
    ResponseUsage,
    Tool,
)
from openai.types.responses.response import ToolChoice
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from openai.types.shared import Reasoning
from pydantic import TypeAdapter, ValidationError

from serve_app.config import ServedTier
from serve_app.protocol import prompt_cache
from serve_app.protocol.request_tools import (
    CustomTool,
    FunctionTool,
    NamedToolChoice,
    NamespaceTool,
    OtherToolChoice,
)
from serve_app.protocol.requests import ResponsesRequest

# The sampling defaults the engine uses when the request leaves them out: echoed like OpenAI does.
from serve_app.values import DEFAULT_TEMPERATURE, DEFAULT_TOP_P

logger = logging.getLogger(__name__)

# OpenAI's defaults for the other echoed request fields.
DEFAULT_PENALTY = 0.0
DEFAULT_TOP_LOGPROBS = 0
DEFAULT_EFFORT = "medium"
DEFAULT_VERBOSITY = "medium"
# The Responses API's default for a function tool's `strict`.
DEFAULT_FUNCTION_STRICT = True

_TOOL = TypeAdapter(Tool)
_TOOL_CHOICE = TypeAdapter(ToolChoice)


# --- ids ----------------------------------------------------------------------------------


def _hex(length: int) -> str:
    return uuid.uuid4().hex[:length]


def new_response_id() -> str:
    """``resp_`` + 32 hex characters."""
    return "resp_" + _hex(32)


# The id prefix of each item type, as OpenAI mints them (``msg_...``); another type's is ``item``.
ITEM_ID_PREFIXES = {
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "compaction": "cmp",
    **{"shell_call": "sh", "local_shell_call": "lsh", "apply_patch_call": "apc"},
    **{
        "shell_call_output": "sho",
        "local_shell_call_output": "lsho",
        "apply_patch_call_output": "apco",
    },
    "tool_search_call": "tsc",
    "tool_search_output": "tso",
}


def new_item_id(prefix: str) -> str:
    """An item id: ``prefix`` (one of `ITEM_ID_PREFIXES`) + ``_`` + 32 hex characters."""
    return f"{prefix}_{_hex(32)}"


def new_message_id() -> str:
    return new_item_id(ITEM_ID_PREFIXES["message"])


def new_compaction_id() -> str:
    return new_item_id(ITEM_ID_PREFIXES["compaction"])


def new_reasoning_id() -> str:
    return new_item_id(ITEM_ID_PREFIXES["reasoning"])


def new_function_call_id() -> str:
    return new_item_id(ITEM_ID_PREFIXES["function_call"])


def new_custom_tool_call_id() -> str:
    return new_item_id(ITEM_ID_PREFIXES["custom_tool_call"])


def new_conversation_id() -> str:
    """``conv_`` + 32 hex characters."""
    return "conv_" + _hex(32)


def new_call_id() -> str:
    """A tool call's ``call_id``: ``call_`` + 24 hex characters."""
    return "call_" + _hex(24)


# --- the in-progress response --------------------------------------------------------------


def initial_response(
    request: ResponsesRequest,
    *,
    response_id: str,
    model: str,
    service_tier: ServedTier = "default",
) -> Response:
    """The ``in_progress`` Response that ``response.created`` carries, echoing the request;
    ``service_tier``: the tier it is served at (not the value asked: OpenAI reports "the
    processing mode actually used"), which every event's Response and the stored one carry."""
    fields: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": model,
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "metadata": request.metadata or {},
        "temperature": _or(request.temperature, DEFAULT_TEMPERATURE),
        "top_p": _or(request.top_p, DEFAULT_TOP_P),
        "max_output_tokens": request.max_output_tokens,
        "parallel_tool_calls": request.parallel_tool_calls,
        "tool_choice": _tool_choice(request),
        "tools": _tools(request),
        "previous_response_id": request.previous_response_id,
        "background": request.background,
        "prompt_cache_key": request.prompt_cache_key,
        "reasoning": _reasoning(request),
        "text": _text(request),
        # `store` is not a field of the SDK's Response (it allows extras); OpenAI sends it.
        "store": request.store,
        "completed_at": None,
        "truncation": request.truncation,
        "max_tool_calls": request.max_tool_calls,
        "presence_penalty": _or(request.presence_penalty, DEFAULT_PENALTY),
        "frequency_penalty": _or(request.frequency_penalty, DEFAULT_PENALTY),
        "top_logprobs": _or(request.top_logprobs, DEFAULT_TOP_LOGPROBS),
        "service_tier": service_tier,
        "safety_identifier": request.safety_identifier,
        "user": request.user,
        "prompt_cache_retention": request.prompt_cache_retention,
        # As applied: mode and ttl with their defaults (the SDK's `Response.prompt_cache_options`).
        "prompt_cache_options": prompt_cache.applied(request.prompt_cache_options).model_dump(
            exclude={"prewarm"}
        ),
        # Null unless the request names a comparison (serve_app/serving/turn/cache_diagnostics.py).
        "prompt_cache_diagnostics": None,
    }
    if request.moderation is not None:
        # Null until the terminal event, which carries both sides' results.
        fields["moderation"] = None
    if request.conversation_id is not None:  # only then: OpenAI leaves it out otherwise
        fields["conversation"] = {"id": request.conversation_id}
    return Response(**fields)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _tools(request: ResponsesRequest) -> list[Tool]:
    """The request's tools as openai types, as sent (every type that reaches a Response is one
    shown or run here: serve_app.protocol.tool_types). A tool model with an ``echo()`` says
    what of it may be echoed (an mcp tool's secrets may not). A tool that does not validate as
    the SDK's type (e.g. a grammar syntax it does not know) is left out of the echo only; it
    was still offered to the model."""
    tools: list[Tool] = []
    for tool in request.tools:
        if isinstance(tool, FunctionTool | CustomTool):
            raw = _tool_dict(tool)
        elif isinstance(tool, NamespaceTool):
            raw = {
                "type": "namespace",
                "name": tool.name,
                # Required by the SDK's NamespaceTool; clients may leave it out.
                "description": tool.description or "",
                "tools": [_tool_dict(inner) for inner in tool.tools],
            }
            if tool.defer_loading is not None:
                raw["defer_loading"] = tool.defer_loading
        else:
            echo = getattr(tool, "echo", None)
            raw = echo() if callable(echo) else tool.model_dump(exclude_none=True, by_alias=True)
        try:
            tools.append(_TOOL.validate_python(raw))
        except ValidationError:
            logger.info("Not echoing tool %r: it does not validate as an openai tool", raw)
    return tools


def _tool_dict(tool: FunctionTool | CustomTool) -> dict[str, Any]:
    data = tool.model_dump(exclude_none=True, by_alias=True)
    if isinstance(tool, FunctionTool):
        # OpenAI echoes every field of a function tool, nulls included, and `strict` with its
        # default when the request left it out.
        data.setdefault("description", None)
        data.setdefault("parameters", None)
        data.setdefault("strict", DEFAULT_FUNCTION_STRICT)
    return data


def _tool_choice(request: ResponsesRequest) -> ToolChoice:
    choice = request.tool_choice
    if isinstance(choice, str):
        return choice
    if isinstance(choice, NamedToolChoice):
        return _TOOL_CHOICE.validate_python({"type": choice.type, "name": choice.name})
    if isinstance(choice, OtherToolChoice):
        try:
            return _TOOL_CHOICE.validate_python(choice.model_dump())
        except ValidationError:
            pass
    # Anything else is served as "auto" (see requests.OtherToolChoice), so say that.
    return "auto"


def _reasoning(request: ResponsesRequest) -> Reasoning:
    """``{effort, summary}`` as asked (gpt-oss always reasons: effort defaults to medium)."""
    options = request.reasoning
    return Reasoning(
        effort=(options.effort if options else None) or DEFAULT_EFFORT,
        summary=options.summary if options else None,
    )


def _text(request: ResponsesRequest) -> ResponseTextConfig:
    """The text format as asked (a json_schema format with all its fields) and verbosity."""
    options = request.text
    text_format: dict[str, Any] = {"type": "text"}
    if options is not None and options.format is not None:
        text_format = options.format.model_dump(exclude_none=True, by_alias=True)
        if text_format["type"] == "json_schema":
            text_format.setdefault("description", None)
            text_format["strict"] = bool(options.format.strict)
    verbosity = (options.verbosity if options else None) or DEFAULT_VERBOSITY
    try:
        return ResponseTextConfig.model_validate({"format": text_format, "verbosity": verbosity})
    except ValidationError:
        # e.g. a json_schema format without a name: echo the verbosity with a text format.
        return ResponseTextConfig.model_validate(
            {"format": {"type": "text"}, "verbosity": verbosity}
        )


# --- the wire form -------------------------------------------------------------------------

# Unix timestamps OpenAI sends as integers; the SDK types them as floats.
_TIMESTAMPS = ("created_at", "completed_at")


def dump_response(response: Response) -> dict[str, Any]:
    """A Response as OpenAI sends it (non-streaming body, or inside a stream event).

    API field names (``schema``, not ``schema_``), only the fields that were set (builders
    set every field clients read, nulls included), integer timestamps. ``warnings=False``:
    an error code outside the SDK's Literal (e.g. ``context_length_exceeded``) is sent as is.
    """
    data = response.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
    integral_timestamps(data)
    return data


def integral_timestamps(response: dict[str, Any]) -> None:
    for key in _TIMESTAMPS:
        value = response.get(key)
        if isinstance(value, float) and value.is_integer():
            response[key] = int(value)


# --- usage --------------------------------------------------------------------------------


def usage(
    prompt_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int
) -> ResponseUsage:
    """Token usage; ``cache_write_tokens`` is required by current SDKs (we report none)."""
    return ResponseUsage(
        input_tokens=prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens, cache_write_tokens=0),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=prompt_tokens + output_tokens,
    )
