"""gpt-oss's own tools, ``browser`` and ``python``, as harmony shows them to the model.

They are described in the system message exactly as gpt-oss was trained: harmony's own tool
configs (`SystemContent.with_browser_tool()`, `.with_python_tool()`; ``ToolNamespaceConfig
.browser()``/``.python()``), not in the developer message our function tools use. The model
calls them on the ``analysis`` channel (``to=browser.search code``, ``to=python code``), and
their results come back as messages from the tool (``browser.search``, ``python``) on the
same channel.

History: a ``web_search_call`` or ``code_interpreter_call`` item renders as the model's call
and the tool's answer. Like reasoning, they belong to the chain of thought: they are dropped
once a final answer follows them (harmony's own rule for the ``analysis`` channel), and kept
within the current turn. OpenAI's ``web_search_call`` carries no result text, so the answer
shown for one is what the item carries: a search's ``sources`` (when the client asked for
them), else a note that the result is not kept; a ``code_interpreter_call``'s answer is its
``logs`` outputs (when included), else the same note. Within one response the tool loop has
the real results and feeds them itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from openai_harmony import Author, Message, Role, SystemContent

# Imported for its registration: the browser's and python's calls are server-run items.
import serve_app.protocol.builtin_items  # noqa: F401
from serve_app.harmony.tools import BROWSER_NAMESPACE, PYTHON, ToolRegistry
from serve_app.protocol.builtin_tools import (
    CodeInterpreterCallItem,
    FindInPageAction,
    OpenPageAction,
    SearchAction,
    WebSearchCallItem,
)
from serve_app.protocol.request_tools import OmittedTool

BuiltinCallItem = WebSearchCallItem | CodeInterpreterCallItem
# gpt-oss writes its own tools' calls as `<|channel|>analysis to=python code<|message|>`.
CALL_CHANNEL = "analysis"
CALL_CONTENT_TYPE = "code"
RESULT_NOT_KEPT = "(The result of this call was not kept.)"


def with_builtin_tools(content: SystemContent, tools: ToolRegistry) -> SystemContent:
    """``content`` with the browser and/or python tool the request offers, harmony's text."""
    kinds = tools.builtin_kinds()
    if "browser" in kinds:
        content = content.with_browser_tool()
    if "python" in kinds:
        content = content.with_python_tool()
    return content


def with_unavailable_notes(content: SystemContent, tools: Sequence[object]) -> SystemContent:
    """``content`` with one line per tool the request is served without (`OmittedTool`: a
    web_search with no browser server), after the model's identity: the model, offered no
    such tool, tells a user who asks for a search that it cannot, rather than invent one."""
    notes = dict.fromkeys(tool.note for tool in tools if isinstance(tool, OmittedTool))
    if not notes:
        return content
    identity = content.model_identity or SystemContent.new().model_identity
    return content.with_model_identity("\n".join([identity or "", *notes]))


def call_recipient(item: BuiltinCallItem) -> str:
    """The harmony recipient of a stored call: ``python``, ``browser.search|open|find``."""
    if isinstance(item, CodeInterpreterCallItem):
        return PYTHON
    action = item.action
    name = "search" if isinstance(action, SearchAction) else "open"
    if isinstance(action, FindInPageAction):
        name = "find"
    return f"{BROWSER_NAMESPACE}.{name}"


def call_body(item: BuiltinCallItem) -> str:
    """What the model wrote: the code, or the browser call's JSON arguments as far as the
    item's action tells them."""
    if isinstance(item, CodeInterpreterCallItem):
        return item.code or ""
    action = item.action
    arguments: dict[str, object] = {}
    if isinstance(action, SearchAction):
        query = action.query or " ".join(action.queries or [])
        arguments = {"query": query}
    elif isinstance(action, OpenPageAction):
        arguments = {"id": action.url} if action.url else {}
    else:
        arguments = {"pattern": action.pattern}
    return json.dumps(arguments, ensure_ascii=False)


def result_text(item: BuiltinCallItem) -> str:
    """The tool's answer as the item carries it (see the module's docstring)."""
    if isinstance(item, CodeInterpreterCallItem):
        logs = item.logs
        return logs if logs is not None else RESULT_NOT_KEPT
    action = item.action
    if isinstance(action, SearchAction) and action.sources:
        lines = [f"[{index}] {source.url}" for index, source in enumerate(action.sources)]
        return "Sources:\n" + "\n".join(lines)
    return RESULT_NOT_KEPT


def call_message(recipient: str, body: str) -> Message:
    return (
        Message.from_role_and_content(Role.ASSISTANT, body)
        .with_channel(CALL_CHANNEL)
        .with_recipient(recipient)
        .with_content_type(CALL_CONTENT_TYPE)
    )


def result_message(recipient: str, text: str) -> Message:
    """The tool's answer to the model, from the tool (``browser.search``, ``python``)."""
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, recipient), text)
        .with_channel(CALL_CHANNEL)
        .with_recipient("assistant")
    )


def history_messages(item: BuiltinCallItem) -> list[Message]:
    """A stored call and its answer, as harmony messages."""
    recipient = call_recipient(item)
    return [call_message(recipient, call_body(item)), result_message(recipient, result_text(item))]
