"""Input items stored by reference, not as copies.

A response's input item that is a stored item already is stored as a marker naming that
item's row, ``{"type": "item_reference", "id": ..., "stored_row": ...}``, with an `ItemRefRow`,
instead of one more copy in the response's input and in the items' index: an item reference
the door resolved, or an item a client sends again. It is one when the latest stored item
with its id and owner that a reference would find, made an input item (``as_input``, the
store's hook: the serving layer's own conversion of a resolved reference), equals it. Reads
put the item back (made an input item the same way), so a response's input items and a
chain read as the copies stored before did; rows stored by older versions hold copies and
read as they are.

A row some input names outlives what held it: deleting a response or a conversation item (by
a client, or the retention sweep) hands each such row to the newest response naming it, whose
own row it then is, as the copy that response stored before would have stayed. An item of an
expired response is still found while a live response names it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from serve_app.store.base import StoredResponse
from serve_app.store.tables import ItemRefRow, ItemRow, ResponseRow, indexed, item_key

MARKER = "stored_row"

# A stored item as a response's input stores it (None: it cannot be an input item).
AsInput = Callable[[dict[str, Any]], dict[str, Any] | None]


def unchanged(item: dict[str, Any]) -> dict[str, Any]:
    return item


# Row ids per IN list (SQLite takes at most 32766 parameters a statement).
_CHUNK = 1000


def visible(cutoff: int | None) -> ColumnElement[bool]:
    """An item row that references find: a conversation's, a live response's (created after
    ``cutoff``), or one a live response's input names. None: every row."""
    if cutoff is None:
        return true()
    referrer = aliased(ResponseRow)
    return (
        ItemRow.response_id.is_(None)
        | exists().where(ResponseRow.id == ItemRow.response_id, ResponseRow.created_at > cutoff)
        | exists().where(
            ItemRefRow.row_id == ItemRow.row_id,
            referrer.id == ItemRefRow.response_id,
            referrer.created_at > cutoff,
        )
    )


async def by_reference(
    session: AsyncSession,
    items: list[dict[str, Any]],
    owner: str | None,
    cutoff: int | None,
    as_input: AsInput = unchanged,
) -> tuple[list[dict[str, Any]], set[int]]:
    """``items`` as a response stores them (each one equal to the latest visible stored item
    with its id and owner, made an input item, replaced by a marker naming that row), and the
    rows named. Those
    rows are locked for share until commit, so no deletion drops one this input names."""
    keys = {item_key(item["id"]) for item in items if indexed(item)}
    if not keys:
        return items, set()
    query = (
        select(ItemRow.row_id, ItemRow.item_json)
        .where(
            ItemRow.item_key.in_(keys),
            ItemRow.owner.is_not_distinct_from(owner),
            visible(cutoff),
        )
        .order_by(ItemRow.row_id)
        .with_for_update(read=True, of=ItemRow)
    )
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    for row_id, data in (await session.execute(query)).all():
        item = json.loads(data)
        latest[item["id"]] = (row_id, item)  # oldest first: the latest wins
    latest = {item_id: (row_id, as_input(item)) for item_id, (row_id, item) in latest.items()}
    # An id this input also gives another item keeps copies: which of its items is the
    # latest with that id then depends on their order, as it did.
    differing = {
        item["id"]
        for item in items
        if indexed(item) and latest.get(item["id"], (0, item))[1] != item
    }
    stored: list[dict[str, Any]] = []
    named: set[int] = set()
    for item in items:
        found = latest.get(item["id"]) if indexed(item) else None
        if found is not None and found[1] == item and item["id"] not in differing:
            stored.append({"type": "item_reference", "id": item["id"], MARKER: found[0]})
            named.add(found[0])
        else:
            stored.append(item)
    return stored, named


async def resolve(
    session: AsyncSession, inputs: Iterable[list[dict[str, Any]]], as_input: AsInput = unchanged
) -> None:
    """Put the named items back in each list of stored input items (in place), made input
    items as they were when stored. A row that is gone (which deletions avoid) leaves a
    plain item reference."""
    inputs = list(inputs)
    wanted = sorted({item[MARKER] for items in inputs for item in items if _is_marker(item)})
    if not wanted:
        return
    found: dict[int, str] = {}
    for start in range(0, len(wanted), _CHUNK):
        query = select(ItemRow.row_id, ItemRow.item_json).where(
            ItemRow.row_id.in_(wanted[start : start + _CHUNK])
        )
        found.update((row_id, data) for row_id, data in (await session.execute(query)).all())
    for items in inputs:
        items[:] = [
            _resolved(item, found, as_input) if _is_marker(item) else item for item in items
        ]


async def stored_responses(
    session: AsyncSession, rows: Sequence[ResponseRow], as_input: AsInput = unchanged
) -> list[StoredResponse]:
    """Responses from their rows, input items stored by reference put back (one query)."""
    stored = [
        StoredResponse(
            id=row.id,
            previous_response_id=row.previous_response_id,
            response=json.loads(row.response_json),
            input_items=json.loads(row.input_items_json),
            owner=row.owner,
        )
        for row in rows
    ]
    await resolve(session, (response.input_items for response in stored), as_input)
    return stored


def _is_marker(item: dict[str, Any]) -> bool:
    return item.get("type") == "item_reference" and isinstance(item.get(MARKER), int)


def _resolved(marker: dict[str, Any], found: dict[int, str], as_input: AsInput) -> dict[str, Any]:
    data = found.get(marker[MARKER])
    item = None if data is None else as_input(json.loads(data))
    return item if item is not None else {"type": "item_reference", "id": marker["id"]}


async def name_rows(session: AsyncSession, response_id: str, rows: Collection[int]) -> None:
    session.add_all(ItemRefRow(response_id=response_id, row_id=row_id) for row_id in rows)


async def release(
    session: AsyncSession, condition: ColumnElement[bool], leaving: Collection[str] = ()
) -> None:
    """Delete the item rows matching ``condition``, except those a response's input names
    (responses in ``leaving`` aside: they are being deleted): each of those becomes the
    newest such response's own row. Heirs are locked for share first: a response deleted at
    the same moment by another transaction is no heir (PostgreSQL skips it once deleted)."""
    rows = list(
        (await session.scalars(select(ItemRow.row_id).where(condition).with_for_update())).all()
    )
    if not rows:
        return
    heirs: dict[int, str] = {}
    for start in range(0, len(rows), _CHUNK):
        query = (
            select(ItemRefRow.row_id, ItemRefRow.response_id)
            .join(ResponseRow, ResponseRow.id == ItemRefRow.response_id)
            .where(ItemRefRow.row_id.in_(rows[start : start + _CHUNK]))
            .order_by(ResponseRow.created_at.desc(), ItemRefRow.response_id)
            .with_for_update(read=True, of=ResponseRow)
        )
        if leaving:
            query = query.where(ItemRefRow.response_id.not_in(list(leaving)))
        for row_id, response_id in (await session.execute(query)).all():
            heirs.setdefault(row_id, response_id)
    for row_id, heir in heirs.items():
        await session.execute(
            update(ItemRow)
            .where(ItemRow.row_id == row_id)
            .values(response_id=heir, conversation_id=None)
        )
        await session.execute(
            delete(ItemRefRow).where(ItemRefRow.row_id == row_id, ItemRefRow.response_id == heir)
        )
    orphans = [row_id for row_id in rows if row_id not in heirs]
    for start in range(0, len(orphans), _CHUNK):
        await session.execute(
            delete(ItemRow).where(ItemRow.row_id.in_(orphans[start : start + _CHUNK]))
        )


async def forget(session: AsyncSession, response_ids: Collection[str]) -> None:
    """The rows these responses' inputs named are named by them no more."""
    await session.execute(delete(ItemRefRow).where(ItemRefRow.response_id.in_(list(response_ids))))
