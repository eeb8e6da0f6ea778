"""The response store on SQLAlchemy 2 async: SQLite (embedded default) or PostgreSQL.

SQLite runs in WAL mode so readers never block the writer and a crash loses no committed
response; PostgreSQL lets many ingress replicas share one store. Each response is one row
written in one transaction, together with the index of its items (``items``), which item
references are resolved through.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Index,
    Integer,
    String,
    Text,
    delete,
    event,
    func,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from serve_app.store.base import ResponseStore, StoredConversation, StoredResponse

logger = logging.getLogger(__name__)


class _Base(DeclarativeBase):
    pass


class ResponseRow(_Base):
    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    previous_response_id: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    response_json: Mapped[str] = mapped_column(Text)
    input_items_json: Mapped[str] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)


class EventRow(_Base):
    """One streamed event of a background response, for polling and resuming streams."""

    __tablename__ = "response_events"

    response_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    sequence_number: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_json: Mapped[str] = mapped_column(Text)


class ConversationRow(_Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    metadata_json: Mapped[str] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(64))


class ConversationItemRow(_Base):
    __tablename__ = "conversation_items"

    conversation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[str] = mapped_column(String(64), index=True)
    item_json: Mapped[str] = mapped_column(Text)


class ItemRow(_Base):
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


def _item_key(item_id: str) -> str:
    return hashlib.sha256(item_id.encode()).hexdigest()


def _item_rows(
    items: Iterable[dict[str, Any]],
    owner: str | None,
    *,
    response_id: str | None = None,
    conversation_id: str | None = None,
) -> list[ItemRow]:
    # A reference is not an item of its own: indexing it would let it resolve to itself.
    return [
        ItemRow(
            item_key=_item_key(item["id"]),
            owner=owner,
            response_id=response_id,
            conversation_id=conversation_id,
            item_json=json.dumps(item),
        )
        for item in items
        if isinstance(item.get("id"), str) and item.get("type") != "item_reference"
    ]


def _private_sqlite_file(path: Path) -> None:
    """The store holds every tenant's prompts and answers: only this user may read it. The
    directories created for it are 0700, the database file 0600, made so before SQLite opens it
    (SQLite gives its -wal and -shm files the database file's mode). A store from before this
    is tightened too; a directory that already existed (``/tmp``, a home) is left as it is."""
    missing = [parent for parent in (path.parent, *path.parent.parents) if not parent.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        directory.chmod(0o700)  # whatever the umask
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if file.exists() and file.stat().st_mode & 0o077:
                file.chmod(0o600)
                logger.warning("response store: %s was readable by others, now 0600", file)
        except OSError as error:
            logger.warning("response store: could not make %s private: %s", file, error)


class SqlResponseStore(ResponseStore):
    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: AsyncEngine | None = None
        self._sessions: async_sessionmaker | None = None

    async def start(self) -> None:
        url = make_url(self.url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            _private_sqlite_file(Path(url.database).expanduser())
        self._engine = create_async_engine(url, pool_pre_ping=True)
        if url.get_backend_name() == "sqlite":
            event.listen(self._engine.sync_engine, "connect", _sqlite_pragmas)
        async with self._engine.begin() as connection:
            await connection.run_sync(_Base.metadata.create_all)
        self._sessions = async_sessionmaker(self._engine, expire_on_commit=False)
        logger.info("response store at %s", url.render_as_string(hide_password=True))

    async def put(self, stored: StoredResponse) -> None:
        row = ResponseRow(
            id=stored.id,
            previous_response_id=stored.previous_response_id,
            created_at=int(stored.response.get("created_at") or time.time()),
            response_json=json.dumps(stored.response),
            input_items_json=json.dumps(stored.input_items),
            owner=stored.owner,
        )
        async with self._session() as session, session.begin():
            existing = await session.get(ResponseRow, stored.id)
            if existing is not None:  # a background response's later snapshot: keep its flag
                row.cancel_requested = existing.cancel_requested
                await session.execute(delete(ItemRow).where(ItemRow.response_id == stored.id))
            await session.merge(row)
            session.add_all(
                _item_rows(
                    [*stored.input_items, *stored.output_items],
                    stored.owner,
                    response_id=stored.id,
                )
            )

    async def get(self, response_id: str) -> StoredResponse | None:
        async with self._session() as session:
            row = await session.get(ResponseRow, response_id)
        if row is None:
            return None
        return StoredResponse(
            id=row.id,
            previous_response_id=row.previous_response_id,
            response=json.loads(row.response_json),
            input_items=json.loads(row.input_items_json),
            owner=row.owner,
        )

    async def delete(self, response_id: str) -> bool:
        async with self._session() as session, session.begin():
            result = await session.execute(delete(ResponseRow).where(ResponseRow.id == response_id))
            await session.execute(delete(EventRow).where(EventRow.response_id == response_id))
            await session.execute(delete(ItemRow).where(ItemRow.response_id == response_id))
        return result.rowcount > 0

    async def find_items(
        self, item_ids: Collection[str], owner: str | None
    ) -> dict[str, dict[str, Any]]:
        wanted = set(item_ids)
        if not wanted:
            return {}
        query = (
            select(ItemRow.item_json)
            .where(
                ItemRow.item_key.in_([_item_key(item_id) for item_id in wanted]),
                ItemRow.owner.is_not_distinct_from(owner),
            )
            .order_by(ItemRow.row_id)
        )
        async with self._session() as session:
            rows = (await session.scalars(query)).all()
        found: dict[str, dict[str, Any]] = {}
        for data in rows:  # oldest first: the latest item with an id wins
            item = json.loads(data)
            if item["id"] in wanted:  # not merely the same digest
                found[item["id"]] = item
        return found

    async def append_events(self, response_id: str, events: list[tuple[int, str]]) -> None:
        if not events:
            return
        rows = [
            EventRow(response_id=response_id, sequence_number=number, event_json=data)
            for number, data in events
        ]
        async with self._session() as session, session.begin():
            session.add_all(rows)

    async def events_after(self, response_id: str, after: int) -> list[tuple[int, str]]:
        query = (
            select(EventRow.sequence_number, EventRow.event_json)
            .where(EventRow.response_id == response_id, EventRow.sequence_number > after)
            .order_by(EventRow.sequence_number)
        )
        async with self._session() as session:
            return [(number, data) for number, data in (await session.execute(query)).all()]

    async def request_cancel(self, response_id: str) -> None:
        async with self._session() as session, session.begin():
            await session.execute(
                update(ResponseRow)
                .where(ResponseRow.id == response_id)
                .values(cancel_requested=True)
            )

    async def cancel_requested(self, response_id: str) -> bool:
        async with self._session() as session:
            row = await session.get(ResponseRow, response_id)
        return bool(row and row.cancel_requested)

    async def put_conversation(self, conversation: StoredConversation) -> None:
        row = ConversationRow(
            id=conversation.id,
            created_at=conversation.created_at,
            metadata_json=json.dumps(conversation.metadata),
            owner=conversation.owner,
        )
        async with self._session() as session, session.begin():
            await session.merge(row)

    async def get_conversation(self, conversation_id: str) -> StoredConversation | None:
        async with self._session() as session:
            row = await session.get(ConversationRow, conversation_id)
        if row is None:
            return None
        return StoredConversation(
            row.id, row.created_at, json.loads(row.metadata_json), owner=row.owner
        )

    async def delete_conversation(self, conversation_id: str) -> bool:
        async with self._session() as session, session.begin():
            result = await session.execute(
                delete(ConversationRow).where(ConversationRow.id == conversation_id)
            )
            await session.execute(
                delete(ConversationItemRow).where(
                    ConversationItemRow.conversation_id == conversation_id
                )
            )
            await session.execute(delete(ItemRow).where(ItemRow.conversation_id == conversation_id))
        return result.rowcount > 0

    async def append_items(self, conversation_id: str, items: list[dict]) -> None:
        async with self._session() as session, session.begin():
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
            owner = await self._conversation_owner(session, conversation_id)
            session.add_all(_item_rows(items, owner, conversation_id=conversation_id))

    async def conversation_items(self, conversation_id: str) -> list[dict]:
        query = (
            select(ConversationItemRow.item_json)
            .where(ConversationItemRow.conversation_id == conversation_id)
            .order_by(ConversationItemRow.position)
        )
        async with self._session() as session:
            return [json.loads(data) for data in (await session.scalars(query)).all()]

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        async with self._session() as session, session.begin():
            result = await session.execute(
                delete(ConversationItemRow).where(
                    ConversationItemRow.conversation_id == conversation_id,
                    ConversationItemRow.item_id == item_id,
                )
            )
            await session.execute(
                delete(ItemRow).where(
                    ItemRow.conversation_id == conversation_id,
                    ItemRow.item_key == _item_key(item_id),
                )
            )
        return result.rowcount > 0

    @staticmethod
    async def _conversation_owner(session: AsyncSession, conversation_id: str) -> str | None:
        return await session.scalar(
            select(ConversationRow.owner).where(ConversationRow.id == conversation_id)
        )

    async def ids(self) -> list[str]:
        async with self._session() as session:
            return list((await session.scalars(select(ResponseRow.id))).all())

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()

    def _session(self):
        if self._sessions is None:
            raise RuntimeError("the response store is not started")
        return self._sessions()


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at each commit in WAL mode
    cursor.execute("PRAGMA busy_timeout=5000")  # writers from other replicas wait, not fail
    cursor.close()
