"""The output items and stream events of the tools the server runs, one builder per tool kind.

A tool the server runs (an MCP server's tool, gpt-oss's ``browser`` or ``python``, the server's
``tool_search``) has an item type of its own (``mcp_call``, ``web_search_call``,
``code_interpreter_call``...) with events of its own. `ResponseEventWriter` writes them through
the `ToolItemBuilder` registered for the call's kind (the ``ToolSpec.kind`` harmony resolved
the recipient to): each branch that adds a kind registers its builder here
(`register_tool_items`), beside its item types, without editing the writer.

The item's life, as the writer drives it:

1. ``added``: the model's header names the tool; ``output_item.added`` carries this item
   (then, for a kind whose builder has ``opened``, its events: ``mcp_call``'s in progress).
2. ``argument_delta``: the model writes the arguments (none for a kind that streams none).
3. ``arguments_done``: the model's ``<|call|>``; the item stays open, pending execution.
4. ``running``: the call starts running (``response.mcp_call.in_progress``,
   ``response.web_search_call.searching``...).
5. ``done``: its result (`ToolResult`), or none when the call never ran (the response ended
   first): the last events before ``output_item.done`` and the finished item it carries.

Events are built with ``sequence_number=0``: the writer numbers them. No harmony, no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from openai.types.responses import ResponseOutputItem, ResponseStreamEvent

from serve_app.protocol.stream_items import OpenItem

ItemStatus = Literal["completed", "incomplete"]


@dataclass(frozen=True)
class ToolResult:
    """What running one call gave: the text the model reads next (the tool's harmony message),
    or the error it reads instead; what the kind's finished item shows."""

    # The tool's output, as the model reads it (the body of the tool's harmony message).
    output: str = ""
    # The call failed: why (the model reads it; the item is a failed one). Never a 500.
    error: str | None = None
    # The kind's own fields for its finished item (a web_search_call's ``action``, a
    # code_interpreter_call's ``outputs``, an mcp_call's raw output...), read by its builder.
    data: Mapping[str, Any] = field(default_factory=dict)
    # The response stops after this round, its item the last word (an approval request the
    # client answers in its next request): no output goes back to the model.
    awaits_client: bool = False

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def model_text(self) -> str:
        """What the model reads: the output, or the error (a failed tool speaks too)."""
        return self.output if self.error is None else f"Error: {self.error}"


class ToolItemBuilder(Protocol):
    """One tool kind's items and events, as the openai SDK types them."""

    # The prefix of its items' ids, as OpenAI mints them (``mcp`` for ``mcp_...``).
    id_prefix: str

    def added(self, item: OpenItem) -> ResponseOutputItem:
        """The item ``output_item.added`` announces (``in_progress``, no arguments yet)."""
        ...

    def argument_delta(self, item: OpenItem, delta: str) -> list[ResponseStreamEvent]:
        """The model wrote ``delta`` more of the arguments (``item.text`` holds them all)."""
        ...

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        """The model's ``<|call|>``: the arguments are whole; the call waits to run."""
        ...

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        """The call starts running."""
        ...

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        """The call's last events and its finished item. ``result`` None: it never ran
        (the response ended first; ``status`` says ``incomplete``)."""
        ...


class QuietEvents:
    """A base for builders whose items have few events of their own (the SDK defines none for
    an approval request or a tool search): no argument or running events unless a subclass
    says so."""

    def argument_delta(self, item: OpenItem, delta: str) -> list[ResponseStreamEvent]:
        return []

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return []

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return []


_BUILDERS: dict[str, ToolItemBuilder] = {}


def register_tool_items(kind: str, builder: ToolItemBuilder) -> None:
    """Make ``kind``'s calls server-run items built by ``builder`` (once, at import; the same
    kind registered again replaces the builder)."""
    _BUILDERS[kind] = builder


def tool_items(kind: str) -> ToolItemBuilder | None:
    """The builder of ``kind``'s items; None: not a kind the server runs (a client's call)."""
    return _BUILDERS.get(kind)


def server_run_kinds() -> frozenset[str]:
    return frozenset(_BUILDERS)
