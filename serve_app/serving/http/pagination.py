"""OpenAI's cursor pagination for item lists."""

from __future__ import annotations

import logging
from typing import Any

from serve_app.protocol.errors import ServerError
from serve_app.serving.admission import stored
from serve_app.store.base import ItemPage, cut_page

logger = logging.getLogger(__name__)


def page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor pagination of a list in listing order: items after the one with id
    ``after``, ``limit`` of them. Ids may repeat (clients choose some): ``after`` resolves to
    the first item with that id, and a page ends only where it would (see `cut_page`)."""
    seen: set[Any] = set()
    entries = []
    for item in items:
        item_id = item.get("id")
        entries.append((item, item_id not in seen))
        seen.add(item_id)
    start = 0
    if after is not None:
        ids = [item.get("id") for item in items]
        stored.check_after(after, after in ids)
        start = ids.index(after) + 1
    found = cut_page(entries[start:], limit)
    if found is None:  # never, with the whole rest of the list: a bug, this request's alone
        logger.error("cut_page found no page in a complete list of %d items", len(items))
        raise ServerError("The list could not be paged.")
    return listing(found)


def listing(found: ItemPage) -> dict[str, Any]:
    """A page as OpenAI answers it."""
    data = found.items
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": found.has_more,
    }
