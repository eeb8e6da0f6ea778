"""``POST /v1/responses/compact``: the model summarizes the history; the answer keeps the
user's messages and one sealed ``compaction`` item standing in for the rest."""

from __future__ import annotations

import time
from typing import Any

from serve_app.harmony import compaction
from serve_app.protocol.requests import InputItem, MessageItem
from serve_app.protocol.responses import ITEM_ID_PREFIXES, new_item_id
from serve_app.serving import metrics
from serve_app.serving.turn import context_management
from serve_app.serving.turn.persistence import stored_item
from serve_app.serving.turn.service import ResponsesService
from serve_app.serving.turn.state import Ask


async def compact(service: ResponsesService, ask: Ask) -> dict[str, Any]:
    """The compacted window: the user's messages, then the sealed summary of everything."""
    request, owner = ask.request, ask.owner
    context = await service.context(ask)
    items = [*context.history, *context.request.input_items]
    summary_ask = context_management.summary_request(request, items)
    # The ask holds the stored history and the summary request as input items too: its item
    # count is the server's doing, not the client's to keep within the limit.
    turn = await service.prepare(Ask(summary_ask, owner, check_limits=False))
    response = await service.run(turn)
    summary = context_management.summary_of(response)
    metrics.COMPACTIONS.inc()
    compaction_id = new_item_id(ITEM_ID_PREFIXES["compaction"])
    # Each an Open Responses `Message` (its compliance test `compact-response`).
    kept = [
        context_management.kept_message(stored_item(item))
        for item in items
        if _is_user_message(item)
    ]
    sealed = compaction.seal_summary(service.vault, summary, owner)
    return {
        "id": compaction_id,
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [
            *kept,
            {"id": compaction_id, "type": "compaction", "encrypted_content": sealed},
        ],
        "usage": response.usage.model_dump(mode="json") if response.usage else None,
    }


def _is_user_message(item: InputItem) -> bool:
    return isinstance(item, MessageItem) and item.role == "user"
