"""Approval requests the server issued to an owner (``mcp_approval_request`` items), whose
approvals a later request may send: one row per (owner, item id) holding a digest of what the
request asked (serve_app/protocol/mcp_items.py, `approval_digest`: the server's label and URL,
the tool, the arguments), never its content.

An approval counts only when the copy of its request in the context matches the row
(serve_app/serving/tools/mcp_trust.py): a request the server never issued to that owner, or
one changed since, runs nothing. Written with the response that issued them (in the same
transaction when it is stored; alone for ``store: false``), swept with the responses. A table
of its own, so a store made by an older version gains it with ``create_all``. (A listing needs
no row: it carries the server's seal.)
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from sqlalchemy import BigInteger, Insert, String, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from serve_app.store.base import IssuedItem
from serve_app.store.tables import Base
from serve_app.store.tool_claims import owner_key


class IssuedItemRow(Base):
    __tablename__ = "issued_items"

    owner_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    item_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[int] = mapped_column(BigInteger, index=True)


async def issue(session: AsyncSession, owner: str | None, items: Sequence[IssuedItem]) -> None:
    """Record ``items`` as issued to ``owner`` (an id recorded already keeps its row)."""
    if not items:
        return
    dialect = (await session.connection()).dialect.name
    if dialect not in ("postgresql", "sqlite"):  # the store runs on these two only
        raise RuntimeError(f"issued items need SQLite or PostgreSQL, not {dialect}")
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    now = int(time.time())
    rows = [
        {"owner_key": owner_key(owner), "item_id": i.item_id, "digest": i.digest, "created_at": now}
        for i in items
    ]
    statement: Insert = insert(IssuedItemRow).values(rows)
    await session.execute(statement.on_conflict_do_nothing(index_elements=["owner_key", "item_id"]))


async def digests(
    session: AsyncSession, owner: str | None, item_ids: Collection[str]
) -> dict[str, str]:
    """The digests of those of ``item_ids`` issued to ``owner``, by id."""
    if not item_ids:
        return {}
    query = select(IssuedItemRow.item_id, IssuedItemRow.digest).where(
        IssuedItemRow.owner_key == owner_key(owner), IssuedItemRow.item_id.in_(set(item_ids))
    )
    return {row.item_id: row.digest for row in (await session.execute(query)).all()}


async def sweep(session: AsyncSession, cutoff: int) -> None:
    """Forget the items issued at or before ``cutoff`` (the store's retention)."""
    await session.execute(delete(IssuedItemRow).where(IssuedItemRow.created_at <= cutoff))
