"""Outputs of client-run tools as a response's own output items: what ``response.inject`` (the
WebSocket beta) commits into a response that waits for them. No harmony, no Ray.

The SDK's output item union (GA and beta alike) has each output type with an ``id`` and a
``status``: an injected output gets an id minted with its type's prefix (``fco_``...) when the
client sent none, and ``status: "completed"`` (an ``apply_patch_call_output`` keeps the status
the client gave it: ``completed`` or ``failed``, the patch's own outcome).
"""

from __future__ import annotations

from typing import Any

from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter

from serve_app.protocol.client_tools import CALL_TOOL
from serve_app.protocol.responses import ITEM_ID_PREFIXES, new_item_id

# The output type that answers each call type the client owes an output for.
OUTPUT_OF_CALL = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    **{call_type: f"{call_type}_output" for call_type in CALL_TOOL},
}
INJECTABLE_TYPES = tuple(OUTPUT_OF_CALL.values())

_OUTPUT_ITEM: TypeAdapter[ResponseOutputItem] = TypeAdapter(ResponseOutputItem)


def output_item(sent: dict[str, Any]) -> ResponseOutputItem:
    """An output item as the client sent it (already read as a valid input item), as the
    response's output item: its fields kept as sent (an image part's URL too), an id minted if
    it had none (as a stored input item's is), ``status`` completed unless it has one."""
    data = {key: value for key, value in sent.items() if value is not None}
    data.setdefault("id", new_item_id(ITEM_ID_PREFIXES[data["type"]]))
    data.setdefault("status", "completed")
    return _OUTPUT_ITEM.validate_python(data)
