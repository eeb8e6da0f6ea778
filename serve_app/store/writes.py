"""The statements of the store's write transactions that several of its methods share: a
response with its items' index, items appended to a conversation (in turn with other appenders),
and what a background run's ending is built from. Each runs in the caller's transaction."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from serve_app.store.base import StoredResponse
from serve_app.store.references import AsInput, by_reference, forget, name_rows, release, unchanged
from serve_app.store.tables import (
    ConversationItemRow,
    ConversationRow,
    EventRow,
    ItemRow,
    ResponseRow,
    RunRow,
    item_rows,
)


async def put_response(
    session: AsyncSession,
    stored: StoredResponse,
    cutoff: int | None = None,
    as_input: AsInput = unchanged,
) -> None:
    """Insert or replace a response and its items' index, in the session's write transaction;
    its input items that are stored items already by reference (serve_app/store/references.py;
    ``cutoff``: the store's expiry, for which stored items a reference still finds;
    ``as_input``: a stored item as an input stores it)."""
    existing = await session.get(ResponseRow, stored.id)
    cancel_requested = False
    if existing is not None:  # a background response's later snapshot: keep its flag
        cancel_requested = existing.cancel_requested
        await release(session, ItemRow.response_id == stored.id)
        await forget(session, [stored.id])
    inputs, named = await by_reference(session, stored.input_items, stored.owner, cutoff, as_input)
    row = ResponseRow(
        id=stored.id,
        previous_response_id=stored.previous_response_id,
        created_at=int(stored.response.get("created_at") or time.time()),
        response_json=json.dumps(stored.response),
        input_items_json=json.dumps(inputs),
        owner=stored.owner,
        cancel_requested=cancel_requested,
        prompt_fingerprint=stored.prompt_fingerprint,
    )
    await session.merge(row)
    await name_rows(session, stored.id, named)
    copies = [item for item, kept in zip(stored.input_items, inputs, strict=True) if kept is item]
    session.add_all(item_rows([*copies, *stored.output_items], stored.owner, response_id=stored.id))


async def delete_responses(session: AsyncSession, response_ids: list[str]) -> int:
    """Delete responses with what hangs off them (their items' index, events, run), in the
    session's write transaction; how many responses there were. Responses continuing them
    keep their own items."""
    if not response_ids:
        return 0
    # The responses' rows first: a transaction handing an item row to one of them (`release`)
    # has locked it and commits first, so the rows it handed over are found below; one
    # coming later finds it gone and hands its rows to another response.
    result = await session.execute(delete(ResponseRow).where(ResponseRow.id.in_(response_ids)))
    await release(session, ItemRow.response_id.in_(response_ids), leaving=response_ids)
    await forget(session, response_ids)
    for table in (EventRow, RunRow):
        await session.execute(delete(table).where(table.response_id.in_(response_ids)))
    return result.rowcount


async def append_items_at_end(
    session: AsyncSession, conversation_id: str, items: list[dict[str, Any]]
) -> None:
    """Add items at the end of a conversation, in the session's write transaction."""
    # Appenders to one conversation take turns, so the last position read here stays
    # the last until these items are in after it: no two calls get the same positions
    # (a primary key conflict, once a 500) and each call's items stay together, in
    # order. PostgreSQL locks the conversation's row until commit (FOR UPDATE); SQLite
    # has no row locks (it drops FOR UPDATE) but this transaction began IMMEDIATE,
    # holding the database's write lock. A lock first: appends are short, so a writer
    # waits its turn (on SQLite up to busy_timeout, 5 s) and only then is retried.
    conversation = (
        await session.execute(
            select(ConversationRow.owner)
            .where(ConversationRow.id == conversation_id)
            .with_for_update()
        )
    ).first()
    if conversation is None:
        return  # deleted meanwhile: there is nothing to extend
    last = await session.scalar(
        select(func.max(ConversationItemRow.position)).where(
            ConversationItemRow.conversation_id == conversation_id
        )
    )
    start = -1 if last is None else last
    session.add_all(
        ConversationItemRow(
            conversation_id=conversation_id,
            position=start + offset,
            item_id=item["id"],
            item_json=json.dumps(item),
        )
        for offset, item in enumerate(items, start=1)
    )
    session.add_all(item_rows(items, conversation.owner, conversation_id=conversation_id))


async def persisted_ending_inputs(session: AsyncSession, response_id: str) -> tuple[list[str], int]:
    """What `RunEnding` builds from: the finished items' events, and the last number."""
    done = (
        await session.scalars(
            select(EventRow.event_json)
            .where(
                EventRow.response_id == response_id,
                # event_json puts "type" first (serve_app.protocol.sse).
                EventRow.event_json.startswith('{"type":"response.output_item.done"'),
            )
            .order_by(EventRow.sequence_number)
        )
    ).all()
    last = await session.scalar(
        select(func.max(EventRow.sequence_number)).where(EventRow.response_id == response_id)
    )
    return list(done), -1 if last is None else last
