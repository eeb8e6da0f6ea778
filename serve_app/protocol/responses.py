"""Builders of ``openai.types.responses`` objects that know nothing of harmony.

Every field a client may read is set explicitly, even when null (``error``,
``incomplete_details``, ``usage``...): the SSE encoder and the non-streaming endpoint dump
with ``exclude_unset``, so what is set here is exactly what goes on the wire, as OpenAI sends
it, and optional fields nobody asked for stay out.
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

from serve_app.protocol.requests import (
    CustomTool,
    FunctionTool,
    NamedToolChoice,
    NamespaceTool,
    OtherToolChoice,
    ResponsesRequest,
)

logger = logging.getLogger(__name__)

# Sampling defaults the engine uses when the request leaves them out; echoed like OpenAI does.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0

_TOOL = TypeAdapter(Tool)
_TOOL_CHOICE = TypeAdapter(ToolChoice)


# --- ids ----------------------------------------------------------------------------------


def _hex(length: int) -> str:
    return uuid.uuid4().hex[:length]


def new_response_id() -> str:
    """``resp_`` + 32 hex characters."""
    return "resp_" + _hex(32)


def new_item_id(prefix: str) -> str:
    """An output item id: ``msg_``, ``rs_``, ``fc_`` or ``ctc_`` + 32 hex characters."""
    return f"{prefix}_{_hex(32)}"


def new_message_id() -> str:
    return new_item_id("msg")


def new_reasoning_id() -> str:
    return new_item_id("rs")


def new_function_call_id() -> str:
    return new_item_id("fc")


def new_custom_tool_call_id() -> str:
    return new_item_id("ctc")


def new_call_id() -> str:
    """A tool call's ``call_id``: ``call_`` + 24 hex characters."""
    return "call_" + _hex(24)


# --- the in-progress response --------------------------------------------------------------


def initial_response(request: ResponsesRequest, *, response_id: str, model: str) -> Response:
    """The ``in_progress`` Response that ``response.created`` carries, echoing the request."""
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
        "temperature": (
            DEFAULT_TEMPERATURE if request.temperature is None else request.temperature
        ),
        "top_p": DEFAULT_TOP_P if request.top_p is None else request.top_p,
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
    }
    if request.conversation_id is not None:  # only then: OpenAI leaves it out otherwise
        fields["conversation"] = {"id": request.conversation_id}
    return Response(**fields)


def _tools(request: ResponsesRequest) -> list[Tool]:
    """The request's function, custom and namespace tools as openai types.

    Hosted tools (web_search...) are left out: this server does not run them. A tool that
    does not validate as the SDK's type (e.g. a grammar syntax it does not know) is left out
    of the echo only; it was still offered to the model.
    """
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
        else:
            continue
        try:
            tools.append(_TOOL.validate_python(raw))
        except ValidationError:
            logger.info("Not echoing tool %r: it does not validate as an openai tool", raw)
    return tools


def _tool_dict(tool: FunctionTool | CustomTool) -> dict[str, Any]:
    return tool.model_dump(exclude_none=True, by_alias=True)


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


def _reasoning(request: ResponsesRequest) -> Reasoning | None:
    if request.reasoning is None:
        return None
    raw = request.reasoning.model_dump(exclude_none=True)
    try:
        return Reasoning.model_validate(raw)
    except ValidationError:
        # e.g. a summary mode the SDK does not know: keep the effort, which is what we used.
        return Reasoning.model_validate({"effort": raw.get("effort")})


def _text(request: ResponsesRequest) -> ResponseTextConfig:
    default = ResponseTextConfig.model_validate({"format": {"type": "text"}})
    if request.text is None:
        return default
    try:
        return ResponseTextConfig.model_validate(
            request.text.model_dump(exclude_none=True, by_alias=True)
        )
    except ValidationError:
        return default


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
