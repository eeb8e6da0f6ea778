"""A tool kind the server runs, for testing the tool loop before the real runners (MCP, browser,
python, tool_search) exist: ``echo``, in the harmony namespace ``testtools``
(``to=testtools.echo``). Its items are shaped as ``mcp_call`` items (server label
``testtools``), with their events, so every event validates against the openai SDK's union.

`EchoRunner` answers ``{"text": ...}`` with ``echo: <text>`` after ``delay_s`` (per text:
``delays``), raises for text ``"raise"``, returns an error for ``"fail"``, and records what it
started, finished and saw cancelled. `EchoServer` (a `ToolServer`) adds the spec to every
request and runs the calls in a session per response (`EchoProvider`: the spec alone, the seam
before servers). Register with `echo_runners()` and pass them to ``create_api(tools=...)``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import (
    ResponseMcpCallArgumentsDeltaEvent,
    ResponseMcpCallArgumentsDoneEvent,
    ResponseMcpCallCompletedEvent,
    ResponseMcpCallFailedEvent,
    ResponseMcpCallInProgressEvent,
    ResponseOutputItem,
    ResponseStreamEvent,
)
from openai.types.responses.response_output_item import McpCall

from serve_app.harmony.tools import ToolSpec
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.stream_items import OpenItem
from serve_app.protocol.tool_items import ItemStatus, ToolResult, register_tool_items
from serve_app.serving.tools.contract import ToolCall, ToolContext, ToolDescription, ToolRunners

KIND = "echo"
NAMESPACE = "testtools"
ECHO_SPEC = ToolSpec(
    name="echo",
    kind=KIND,  # type: ignore[arg-type]  # a test kind, beside "function" and "custom"
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
    namespace=NAMESPACE,
)


class EchoItems:
    """The echo kind's items and events: ``mcp_call`` ones."""

    id_prefix = "mcp"

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return _call(item, "", status="in_progress")

    def argument_delta(self, item: OpenItem, delta: str) -> list[ResponseStreamEvent]:
        return [
            ResponseMcpCallArgumentsDeltaEvent(
                type="response.mcp_call_arguments.delta", delta=delta, **_common(item)
            )
        ]

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            ResponseMcpCallArgumentsDoneEvent(
                type="response.mcp_call_arguments.done", arguments=item.text, **_common(item)
            )
        ]

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            ResponseMcpCallInProgressEvent(type="response.mcp_call.in_progress", **_common(item))
        ]

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        if result is None or result.failed:
            error = None if result is None else result.error
            failed = ResponseMcpCallFailedEvent(type="response.mcp_call.failed", **_common(item))
            final_status = "failed" if result is not None else status
            return [failed], _call(item, item.text, status=final_status, error=error)
        completed = ResponseMcpCallCompletedEvent(
            type="response.mcp_call.completed", **_common(item)
        )
        return [completed], _call(item, item.text, status="completed", output=result.output)


def _common(item: OpenItem) -> dict[str, Any]:
    return {"item_id": item.item_id, "output_index": item.output_index, "sequence_number": 0}


def _call(
    item: OpenItem,
    arguments: str,
    *,
    status: str,
    output: str | None = None,
    error: str | None = None,
) -> McpCall:
    fields: dict[str, Any] = {}
    if error is not None:
        fields["error"] = {"type": "mcp_protocol_error", "code": -32603, "message": error}
    return McpCall.model_validate(
        {
            "id": item.item_id,
            "type": "mcp_call",
            "server_label": item.namespace or NAMESPACE,
            "name": item.name,
            "arguments": arguments,
            "status": status,
            "output": output,
            **fields,
        }
    )


@dataclass
class EchoRunner:
    """Echoes ``text`` after a delay; records its calls (``started``/``finished``/
    ``cancelled``: the texts, in the order it saw them)."""

    delay_s: float = 0.0
    delays: dict[str, float] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    times: list[tuple[float, float]] = field(default_factory=list)
    _started_event: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, call: ToolCall) -> ToolResult:
        text = str(json.loads(call.arguments or "{}").get("text", ""))
        self.calls.append(call)
        self.started.append(text)
        self._started_event.set()
        began = time.monotonic()
        try:
            await asyncio.sleep(self.delays.get(text, self.delay_s))
        except asyncio.CancelledError:
            self.cancelled.append(text)
            raise
        self.times.append((began, time.monotonic()))
        self.finished.append(text)
        if text == "raise":
            raise RuntimeError("the echo tool broke")
        if text == "fail":
            return ToolResult(error="echo refused: fail")
        if text == "approve":
            return ToolResult(output="", awaits_client=True)
        return ToolResult(output=f"echo: {text}")

    async def wait_started(self, count: int = 1) -> None:
        """Return once ``count`` calls started."""
        while len(self.started) < count:
            await self._started_event.wait()
            self._started_event.clear()


class EchoProvider:
    """Adds the echo tool to every request (a `ToolProvider`, the seam before servers)."""

    async def specs(self, request: ResponsesRequest, owner: str | None) -> Sequence[ToolSpec]:
        return [ECHO_SPEC]


@dataclass
class EchoServer:
    """The echo tool as a `ToolServer`: in every request, described by its spec, its calls
    run by ``runner`` in a session per response (``sessions`` records each one opened, and
    whether it was closed)."""

    runner: EchoRunner
    kinds: frozenset[str] = frozenset({KIND})
    sessions: list[EchoSession] = field(default_factory=list)

    def has(self, request: ResponsesRequest) -> bool:
        return True

    async def describe(self, context: ToolContext) -> ToolDescription:
        return ToolDescription([ECHO_SPEC])

    def session(self, owner: str | None, response_id: str) -> EchoSession:
        self.sessions.append(EchoSession(self.runner, response_id))
        return self.sessions[-1]


@dataclass
class EchoSession:
    runner: EchoRunner
    response_id: str
    calls: int = 0
    closed: bool = False

    async def run(self, call: ToolCall) -> ToolResult:
        self.calls += 1
        return await self.runner.run(call)

    async def aclose(self) -> None:
        self.closed = True


def register_echo() -> None:
    register_tool_items(KIND, EchoItems())


def echo_runners(runner: EchoRunner | None = None, *, max_rounds: int = 8) -> ToolRunners:
    """Tool servers with the echo one (its items registered): its spec in every request."""
    register_echo()
    return ToolRunners(servers=[EchoServer(runner or EchoRunner())], max_rounds=max_rounds)
