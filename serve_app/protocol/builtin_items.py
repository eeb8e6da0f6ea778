"""The items and events of gpt-oss's own tools, as the openai SDK types them, registered with
the tool loop's per-kind builders (tool_items.py) at import:

- kind ``browser`` (``browser.search``, ``.open``, ``.find``): a ``web_search_call`` whose
  ``action`` is ``search`` (``query``; ``sources`` when a runner gives them), ``open_page``
  (``url``) or ``find_in_page`` (``pattern``, ``url``). Events:
  ``response.web_search_call.in_progress`` (the call is whole), ``.searching`` (it runs),
  ``.completed``; no argument deltas (OpenAI streams none for a web search).
- kind ``python``: a ``code_interpreter_call`` (``code``, ``container_id``, ``outputs``: the
  logs, when the runner gives them: it does when ``include`` asks for
  ``code_interpreter_call.outputs``). Events: ``response.code_interpreter_call.in_progress``,
  ``response.code_interpreter_call_code.delta`` as the model writes the code, ``.code.done``,
  ``.interpreting`` (it runs), ``.completed``.

A failed call ends ``failed`` (no completed event: the SDK has no failed event for either);
one that never ran, ``incomplete``. Events carry ``sequence_number=0``: the writer numbers
them. No harmony, no Ray.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import (
    ResponseCodeInterpreterCallCodeDeltaEvent,
    ResponseCodeInterpreterCallCodeDoneEvent,
    ResponseCodeInterpreterCallCompletedEvent,
    ResponseCodeInterpreterCallInProgressEvent,
    ResponseCodeInterpreterCallInterpretingEvent,
    ResponseCodeInterpreterToolCall,
    ResponseFunctionWebSearch,
    ResponseOutputItem,
    ResponseStreamEvent,
    ResponseWebSearchCallCompletedEvent,
    ResponseWebSearchCallInProgressEvent,
    ResponseWebSearchCallSearchingEvent,
)
from openai.types.responses.response_code_interpreter_tool_call import OutputLogs
from openai.types.responses.response_function_web_search import (
    ActionFind,
    ActionOpenPage,
    ActionSearch,
    ActionSearchSource,
)

from serve_app.protocol.builtin_tools import AUTO_CONTAINER
from serve_app.protocol.stream_items import OpenItem
from serve_app.protocol.tool_items import (
    ItemStatus,
    QuietEvents,
    ToolResult,
    register_tool_items,
)

BROWSER_KIND = "browser"
PYTHON_KIND = "python"
# What a runner may put in `ToolResult.data` for these items.
SOURCES = "sources"  # browser.search: the result URLs (list of str)
URL = "url"  # browser.open / .find: the page's URL
LOGS = "logs"  # python: the output text, for `outputs`
CONTAINER_ID = "container_id"  # python: the container it ran in

_EVENT_COMMON = {"sequence_number": 0}


def _common(item: OpenItem) -> dict[str, Any]:
    return {"item_id": item.item_id, "output_index": item.output_index, **_EVENT_COMMON}


def _final_status(result: ToolResult | None, status: ItemStatus) -> str:
    if result is None or status != "completed":
        return "incomplete"
    return "failed" if result.failed else "completed"


# --- web_search_call -------------------------------------------------------------------------


def browser_arguments(text: str) -> dict[str, Any]:
    """The browser call's arguments as the model wrote them ({} when they are not a JSON
    object: the runner answers that with an error the model reads)."""
    try:
        arguments = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}


def web_search_action(
    name: str, arguments: dict[str, Any], data: dict[str, Any] | None = None
) -> ActionSearch | ActionOpenPage | ActionFind:
    """The item's ``action`` for a call of ``browser.<name>``: what the arguments say, with
    what the runner learnt (``data``: the page's URL, the sources)."""
    data = data or {}
    url = data.get(URL)
    if name == "open":
        target = arguments.get("id")
        url = url or (target if isinstance(target, str) else None)
        return ActionOpenPage(type="open_page", url=url)
    if name == "find":
        pattern = arguments.get("pattern")
        return ActionFind(
            type="find_in_page",
            pattern=pattern if isinstance(pattern, str) else "",
            url=url if isinstance(url, str) else "",
        )
    query = arguments.get("query")
    sources = data.get(SOURCES)
    return ActionSearch(
        type="search",
        query=query if isinstance(query, str) else None,
        sources=[ActionSearchSource(type="url", url=source) for source in sources]
        if isinstance(sources, list)
        else None,
    )


class WebSearchCallItems(QuietEvents):
    """Kind ``browser``: ``web_search_call`` items and events."""

    id_prefix = "ws"

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return ResponseFunctionWebSearch(
            id=item.item_id,
            type="web_search_call",
            status="in_progress",
            action=web_search_action(item.name, {}),
        )

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            ResponseWebSearchCallInProgressEvent(
                type="response.web_search_call.in_progress", **_common(item)
            )
        ]

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            ResponseWebSearchCallSearchingEvent(
                type="response.web_search_call.searching", **_common(item)
            )
        ]

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        final_status = _final_status(result, status)
        data = dict(result.data) if result is not None else {}
        final = ResponseFunctionWebSearch(
            id=item.item_id,
            type="web_search_call",
            status=final_status,  # type: ignore[arg-type]
            action=web_search_action(item.name, browser_arguments(item.text), data),
        )
        events: list[ResponseStreamEvent] = []
        if final_status == "completed":
            events.append(
                ResponseWebSearchCallCompletedEvent(
                    type="response.web_search_call.completed", **_common(item)
                )
            )
        return events, final


# --- code_interpreter_call -------------------------------------------------------------------

_STARTED = "in_progress_sent"


class CodeInterpreterCallItems:
    """Kind ``python``: ``code_interpreter_call`` items and events."""

    id_prefix = "ci"

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return ResponseCodeInterpreterToolCall(
            id=item.item_id,
            type="code_interpreter_call",
            status="in_progress",
            code="",
            container_id=AUTO_CONTAINER,
            outputs=None,
        )

    def _in_progress(self, item: OpenItem) -> list[ResponseStreamEvent]:
        """``in_progress`` once, before the first code delta (OpenAI's order)."""
        if item.data.get(_STARTED):
            return []
        item.data[_STARTED] = True
        return [
            ResponseCodeInterpreterCallInProgressEvent(
                type="response.code_interpreter_call.in_progress", **_common(item)
            )
        ]

    def argument_delta(self, item: OpenItem, delta: str) -> list[ResponseStreamEvent]:
        return [
            *self._in_progress(item),
            ResponseCodeInterpreterCallCodeDeltaEvent(
                type="response.code_interpreter_call_code.delta", delta=delta, **_common(item)
            ),
        ]

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            *self._in_progress(item),
            ResponseCodeInterpreterCallCodeDoneEvent(
                type="response.code_interpreter_call_code.done", code=item.text, **_common(item)
            ),
        ]

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            ResponseCodeInterpreterCallInterpretingEvent(
                type="response.code_interpreter_call.interpreting", **_common(item)
            )
        ]

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        final_status = _final_status(result, status)
        data = dict(result.data) if result is not None else {}
        logs = data.get(LOGS)
        final = ResponseCodeInterpreterToolCall(
            id=item.item_id,
            type="code_interpreter_call",
            status=final_status,  # type: ignore[arg-type]
            code=item.text,
            container_id=str(data.get(CONTAINER_ID) or AUTO_CONTAINER),
            outputs=[OutputLogs(type="logs", logs=logs)] if isinstance(logs, str) else None,
        )
        events: list[ResponseStreamEvent] = []
        if final_status == "completed":
            events.append(
                ResponseCodeInterpreterCallCompletedEvent(
                    type="response.code_interpreter_call.completed", **_common(item)
                )
            )
        return events, final


register_tool_items(BROWSER_KIND, WebSearchCallItems())
register_tool_items(PYTHON_KIND, CodeInterpreterCallItems())
