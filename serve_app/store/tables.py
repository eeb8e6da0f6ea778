"""The response store's tables (SQLAlchemy's ORM), the item index's rows, the conversation page
query, and the migration of stores made by older versions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    Select,
    String,
    Text,
    exists,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import DeclarativeBase, Mapped, aliased, mapped_column


class Base(DeclarativeBase):
    pass


class ResponseRow(Base):
    __tablename__ = "responses"
    # The retention sweep takes the oldest first (`migrate` adds it to older stores).
    __table_args__ = (Index("ix_responses_created_at", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    previous_response_id: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    response_json: Mapped[str] = mapped_column(Text)
    input_items_json: Mapped[str] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # Prompt-cache diagnostics' fingerprint of its prompt (`StoredResponse.prompt_fingerprint`):
    # deferred, so reading a response never loads it (`migrate` adds it to older stores).
    prompt_fingerprint: Mapped[str | None] = mapped_column(Text, deferred=True)


class EventRow(Base):
    """One streamed event of a background response, for polling and resuming streams."""

    __tablename__ = "response_events"

    response_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    sequence_number: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_json: Mapped[str] = mapped_column(Text)


class RunRow(Base):
    """The lease of a background response's run (see `BackgroundRun`). A table of its own,
    keyed by the response, so stores made before leases existed gain it with ``create_all``."""

    __tablename__ = "background_runs"
    __table_args__ = (Index("ix_background_runs_ended_expiry", "ended", "lease_expires_at"),)

    response_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    runner: Mapped[str] = mapped_column(String(128))
    lease_expires_at: Mapped[float] = mapped_column(Float)
    ended: Mapped[bool] = mapped_column(Boolean, default=False)


class ConversationRow(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    metadata_json: Mapped[str] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(64))


class ConversationItemRow(Base):
    """A conversation's item at its position: the server's order, which paging follows.

    ``item_id`` is the client's choice for some items: any length up to the API's limit
    (``MAX_ITEM_ID_LENGTH``, 256 characters, small enough for a PostgreSQL index entry), and
    not unique. It was VARCHAR(64) before: `_migrate` widens it on PostgreSQL (SQLite never
    enforced the length, so an old SQLite file is already fine).
    """

    __tablename__ = "conversation_items"

    conversation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[str] = mapped_column(Text, index=True)
    item_json: Mapped[str] = mapped_column(Text)


class ItemRow(Base):
    """A stored item by its id, for item references: each input and output item of a stored
    response and each conversation item, with its owner.

    Ids are not unique (clients choose some, and a referenced item is stored again as the
    input of the response that referenced it) and may be long: rows are keyed by a surrogate,
    and looked up by a digest of the id with the owner.
    """

    __tablename__ = "items"
    __table_args__ = (Index("ix_items_item_key_owner", "item_key", "owner"),)

    # BIGINT on PostgreSQL; SQLite autoincrements only an INTEGER primary key.
    row_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    item_key: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str | None] = mapped_column(String(64))
    # Where the item is stored (one of the two), so deleting that removes it from the index.
    response_id: Mapped[str | None] = mapped_column(String(64), index=True)
    conversation_id: Mapped[str | None] = mapped_column(String(64), index=True)
    item_json: Mapped[str] = mapped_column(Text)


class ItemRefRow(Base):
    """A stored response's input item that is a stored item already (the same id, owner and
    content: an item reference resolved, or an item sent again): its input names that item's
    row instead of holding a copy (serve_app/store/references.py). A table of its own, so
    stores made before it gain it with ``create_all``."""

    __tablename__ = "item_refs"

    response_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    row_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, index=True)


def item_key(item_id: str) -> str:
    return hashlib.sha256(item_id.encode()).hexdigest()


def indexed(item: dict[str, Any]) -> bool:
    """An item the index holds: one with an id. A reference is not an item of its own:
    indexing it would let it resolve to itself."""
    return isinstance(item.get("id"), str) and item.get("type") != "item_reference"


def item_rows(
    items: Iterable[dict[str, Any]],
    owner: str | None,
    *,
    response_id: str | None = None,
    conversation_id: str | None = None,
) -> list[ItemRow]:
    return [
        ItemRow(
            item_key=item_key(item["id"]),
            owner=owner,
            response_id=response_id,
            conversation_id=conversation_id,
            item_json=json.dumps(item),
        )
        for item in items
        if indexed(item)
    ]


def page_query(conversation_id: str, start: int | None, descending: bool, limit: int) -> Select:
    """Items after position ``start`` in listing order, each with its position and whether it
    is the first item with its id in that order (the one an ``after`` naming it resolves to)."""
    row, other = ConversationItemRow, aliased(ConversationItemRow)
    earlier = other.position > row.position if descending else other.position < row.position
    repeated = exists().where(
        other.conversation_id == row.conversation_id, other.item_id == row.item_id, earlier
    )
    query = select(row.position, row.item_json, ~repeated).where(
        row.conversation_id == conversation_id
    )
    if start is not None:
        query = query.where(row.position < start if descending else row.position > start)
    return query.order_by(row.position.desc() if descending else row.position).limit(limit)


# Any number: the PostgreSQL advisory lock the schema's creators take turns on.
_SCHEMA_LOCK = 38_5238


async def take_schema_turn(connection: AsyncConnection) -> None:
    """On PostgreSQL, wait for the other replicas creating the schema to commit (the lock ends
    with the transaction). Replicas starting at once on a fresh database (or on one from before
    a new table, such as ``server_secrets``) would each CREATE TABLE, and all but one failed on
    PostgreSQL's catalog (``pg_type_typname_nsp_index``), an error no retry is for. SQLite's
    writers take turns already (``BEGIN IMMEDIATE``)."""
    if connection.dialect.name == "postgresql":
        await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})


async def migrate(connection) -> None:
    """Bring a store made by an older version up to date (``create_all`` makes missing tables
    only): the responses' ``created_at`` index and ``prompt_fingerprint`` column; conversation
    item ids were VARCHAR(64), too short for clients' ids."""
    await connection.execute(
        text("CREATE INDEX IF NOT EXISTS ix_responses_created_at ON responses (created_at)")
    )
    await _add_fingerprint_column(connection)
    if connection.dialect.name != "postgresql":
        return
    column_type = await connection.scalar(
        text(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = 'conversation_items' AND column_name = 'item_id'"
        )
    )
    if column_type == "character varying":
        await connection.execute(
            text("ALTER TABLE conversation_items ALTER COLUMN item_id TYPE text")
        )


async def _add_fingerprint_column(connection) -> None:
    """``responses.prompt_fingerprint``, in a store made before diagnostics (its responses keep
    none: a comparison with one is ``unavailable``)."""
    if connection.dialect.name == "postgresql":
        await connection.execute(
            text("ALTER TABLE responses ADD COLUMN IF NOT EXISTS prompt_fingerprint text")
        )
        return
    columns = (await connection.execute(text("PRAGMA table_info(responses)"))).all()
    if "prompt_fingerprint" not in {column[1] for column in columns}:
        await connection.execute(text("ALTER TABLE responses ADD COLUMN prompt_fingerprint TEXT"))
