"""Server-sent events in the shape OpenAI streams Responses events.

Each event is ``event: <type>`` then ``data: <json>`` and a blank line. There is no
``data: [DONE]`` sentinel: the Responses API ends with its terminal event
(``response.completed``, ``response.incomplete`` or ``response.failed``).
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import ResponseStreamEvent

from serve_app.protocol.responses import integral_timestamps


def event_data(event: ResponseStreamEvent) -> dict[str, Any]:
    """The event as sent: API field names, only the fields that were set.

    Builders set every field a client reads, including required-but-null ones
    (``response.error``, ``incomplete_details``), so ``exclude_unset`` keeps those and drops
    the SDK's many optional fields nobody set. ``warnings=False``: an error code outside the
    SDK's Literal (e.g. ``context_length_exceeded``) is sent as is, on purpose.
    """
    data = event.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
    response = data.get("response")
    if isinstance(response, dict):
        integral_timestamps(response)
    # `type` first, as OpenAI orders it: easier to read in logs and captures.
    return {"type": data.pop("type"), **data}


def event_json(event: ResponseStreamEvent) -> str:
    # UTF-8 as is (no \u escapes): SSE is UTF-8 and the text stays readable in captures.
    return json.dumps(event_data(event), ensure_ascii=False, separators=(",", ":"))


def encode_event(event: ResponseStreamEvent) -> bytes:
    return f"event: {event.type}\ndata: {event_json(event)}\n\n".encode()
