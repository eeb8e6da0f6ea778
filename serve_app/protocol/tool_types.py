"""Every tool type the openai SDK's ``Tool`` union defines, and what this server does with it.

Nothing a client sends in ``tools`` is silently dropped: each type is shown to the model (its
calls go back to the client), run by the server (the tool loop, serve_app/serving/tools/), or
refused with the 400 OpenAI answers for a model that lacks the tool; a type clients send by
default (Codex's web_search) that the deployment cannot run is served without (`omitted`), the
model and the client told so. A branch that makes a type
work changes that type's one row here (and types it in request_tools.py); docs/protocol.md's
tool table says the same, row for row, and tests/unit/protocol/test_tool_types.py holds this
table to the SDK's union, so a type the SDK adds fails until a row names it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.config import AppArgs


class Handling(enum.Enum):
    SHOWN = "shown"  # rendered for the model; its calls go back to the client
    RUN = "run"  # run by the server inside the response (the tool loop)
    REFUSED = "refused"  # a 400 naming `tools[i].type`


def _always(_: AppArgs) -> bool:
    return True


def _never(_: AppArgs) -> bool:
    return False


@dataclass(frozen=True)
class ToolRow:
    handling: Handling
    # Whether the operator configured what the type needs (a tool server...): a type whose row
    # says shown or run is refused as well when this says no.
    configured: Callable[[AppArgs], bool] = _always
    # What the operator sets to configure it (said in the 400 when it is not).
    needs: str = ""
    # Whether a request holding it, when it is not configured, is served without it rather
    # than refused: for a type clients send by default, not on purpose (Codex's web_search).
    omitted: Callable[[AppArgs], bool] = _never
    # The line of the system message that tells the model it is unavailable, when omitted.
    unavailable_note: str = ""
    # What the client can do instead, said in the 400 when it is refused.
    client_remedy: str = ""


SHOWN = ToolRow(Handling.SHOWN)
RUN = ToolRow(Handling.RUN)
REFUSED = ToolRow(Handling.REFUSED)
BROWSER = ToolRow(
    Handling.RUN,
    configured=lambda args: bool(args.tools.browser_server_url),
    needs="browser tool server (the operator sets tools.browser_server_url)",
    omitted=lambda args: args.tools.web_search_without_browser == "omit",
    unavailable_note=(
        "Web search is unavailable on this server: you cannot search or browse the web. "
        "If asked to, say so."
    ),
    client_remedy=(
        'leave the web search tool out of the request (Codex: web_search = "disabled" in '
        "its config.toml)"
    ),
)
PYTHON = ToolRow(
    Handling.RUN,
    configured=lambda args: bool(args.tools.python_server_url),
    needs="python tool server (the operator sets tools.python_server_url)",
)

# One row per `type` value of the SDK's `Tool` union (openai/types/responses/tool.py), dated
# aliases included.
TOOL_TYPES: dict[str, ToolRow] = {
    "function": SHOWN,
    "custom": SHOWN,
    "namespace": SHOWN,
    # execution "server" (the default): run here; "client": shown, the client searches.
    "tool_search": RUN,
    "mcp": RUN,
    # gpt-oss's browser and python: run by the operator's tool servers, refused without one.
    "web_search": BROWSER,
    "web_search_2025_08_26": BROWSER,
    "web_search_preview": BROWSER,
    "web_search_preview_2025_03_11": BROWSER,
    "code_interpreter": PYTHON,
    "shell": SHOWN,
    "local_shell": SHOWN,
    "apply_patch": SHOWN,
    # Its outputs are screenshots: gpt-oss reads text only (docs/protocol.md).
    "computer_use_preview": REFUSED,
    "computer": REFUSED,
    # No vector stores, no image model, no programmatic caller here.
    "file_search": REFUSED,
    "image_generation": REFUSED,
    "programmatic_tool_calling": REFUSED,
}


def missing(tool_type: str, args: AppArgs) -> str:
    """What the operator has not configured for a type that needs it ("" when nothing)."""
    row = TOOL_TYPES.get(tool_type)
    if row is None or row.handling is Handling.REFUSED or row.configured(args):
        return ""
    return row.needs


def omitted(tool_type: str, args: AppArgs) -> bool:
    """Whether a tool of ``tool_type`` is left out of the request and the request served
    without it (a type clients send by default whose tool server the operator has not set)."""
    row = TOOL_TYPES.get(tool_type)
    return row is not None and not accepted(tool_type, args) and row.omitted(args)


def accepted(tool_type: str, args: AppArgs) -> bool:
    """Whether a tool of ``tool_type`` is shown or run here (False: refused, or unknown)."""
    row = TOOL_TYPES.get(tool_type)
    return row is not None and row.handling is not Handling.REFUSED and row.configured(args)
