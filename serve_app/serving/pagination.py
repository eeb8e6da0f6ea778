"""OpenAI's cursor pagination for item lists."""

from __future__ import annotations

from serve_app.protocol.errors import InvalidRequest


def page(items: list[dict], after: str | None, limit: int) -> dict:
    """OpenAI's cursor pagination: items after the one with id ``after``, ``limit`` of them."""
    start = 0
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise InvalidRequest(f"No item with id '{after}' in this list.", param="after")
        start = ids.index(after) + 1
    page = items[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(items),
    }
