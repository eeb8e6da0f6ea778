"""Calls of tools the request does not have, answered by the server inside the response.

gpt-oss sometimes addresses a call to a recipient no tool of the request resolves to (it
invents ``repo_browser.search``, or calls a function the client never declared). OpenAI never
returns a call of an undeclared tool, and clients fail on one (the Agents SDKs end the run:
"Tool ... not found"), so the translator opens no item for it (harmony/items.py,
`UnknownCall`) and the tool loop (loop.py, `ToolLoop.answer_unknown`) answers it: the model's
call stays in the next completion's prompt, followed by that recipient's message (a tool's, on
the call's channel, to the assistant) saying no such tool is available and which are, and the
model goes on in the same response. The client sees only what the model does next.
"""

from __future__ import annotations

import logging

from serve_app.harmony.items import UnknownCall
from serve_app.harmony.tool_messages import tool_message_tokens
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.tool_items import ToolResult
from serve_app.serving import metrics

logger = logging.getLogger(__name__)

# What the answer lists of the request's tools, at most: a request may declare hundreds, and
# the answer is rendered on the event loop (so it stays short, never the tools' schemas).
LISTED_CHARS = 1_000
# What the answer repeats of the recipient (a header's worth of tokens already bounds it).
NAME_CHARS = 200


def unknown_tool_error(recipient: str, tools: ToolRegistry) -> str:
    """What the model reads for a call of ``recipient``: no such tool, and the tools it may
    call, named as it calls them (``functions.get_weather``, ``browser.search``), bounded."""
    said = f'No tool named "{recipient[:NAME_CHARS]}" is available.'
    names = [spec.recipient for spec in tools.tools if tools.callable(spec)]
    if not names:
        return f"{said} This request offers no tools: answer without calling one."
    return f"{said} Available tools: {listed(names)}."


def listed(names: list[str]) -> str:
    """``names`` joined, as many as fit `LISTED_CHARS` (at least one), then how many more."""
    shown: list[str] = []
    size = 0
    for name in names:
        size += len(name) + 2
        if shown and size > LISTED_CHARS:
            break
        shown.append(name)
    rest = len(names) - len(shown)
    text = ", ".join(shown)
    return f"{text} (and {rest} more)" if rest else text


def answer_tokens(call: UnknownCall, error: str) -> list[int]:
    """The recipient's answer as the next prompt holds it: ``error`` as a failed tool's text
    (``Error: ...``, as every failed call reads), authored by the recipient, on the call's
    channel, to the assistant. Short (the error is bounded), so rendered here."""
    return tool_message_tokens(call.recipient, call.channel, ToolResult(error=error).model_text)


def record(response_id: str, call: UnknownCall) -> None:
    """Counted and logged: which response, which recipient (never the arguments, which may
    hold what the user asked the model to keep)."""
    metrics.UNKNOWN_TOOL_CALLS.inc()
    logger.info(
        "response %s: the model called %r, which is no tool of the request: answered with an "
        "error, not shown to the client",
        response_id,
        call.recipient[:NAME_CHARS],
        extra={"response_id": response_id, "recipient": call.recipient[:NAME_CHARS]},
    )
