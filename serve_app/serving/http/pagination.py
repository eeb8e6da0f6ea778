"""OpenAI's cursor pagination for item lists: the query parameters every list route takes
(`Paging`) and the pages it answers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, Query

from serve_app.protocol.errors import ServerError
from serve_app.serving.admission import stored
from serve_app.store.base import ItemPage, cut_page

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Page:
    """Which page of a list the client asked for: the items after the one with id ``after``,
    ``limit`` of them, in ``order`` (``desc``: newest first)."""

    after: str | None
    limit: int
    order: Literal["asc", "desc"]


def page_query(
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Page:
    """OpenAI's paging parameters and bounds, declared once for every list route; a bad value
    is FastAPI's validation error, so the same 400 on every route."""
    return Page(after, limit, order)


Paging = Annotated[Page, Depends(page_query)]


def page(items: list[dict[str, Any]], asked: Page) -> dict[str, Any]:
    """OpenAI's cursor pagination of a list held in memory, oldest item first: in the order
    asked, the items after the one with id ``after``, ``limit`` of them. Ids may repeat
    (clients choose some): ``after`` resolves to the first item with that id in that order, and
    a page ends only where it would (see `cut_page`)."""
    if asked.order == "desc":
        items = items[::-1]
    seen: set[Any] = set()
    entries = []
    for item in items:
        item_id = item.get("id")
        entries.append((item, item_id not in seen))
        seen.add(item_id)
    start = 0
    if asked.after is not None:
        ids = [item.get("id") for item in items]
        stored.check_after(asked.after, asked.after in ids)
        start = ids.index(asked.after) + 1
    found = cut_page(entries[start:], asked.limit)
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
