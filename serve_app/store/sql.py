"""The response store on SQLAlchemy 2 async: SQLite (embedded default) or PostgreSQL.

SQLite runs in WAL mode so readers never block the writer and a crash loses no committed
response; PostgreSQL lets many ingress replicas share one store. Each response is one row
written in one transaction, together with the index of its items (``items``), which item
references are resolved through. Every write is one transaction that sees what it reads
(on SQLite: see `_sqlite_begin`).

Every write goes through `SqlResponseStore._transact`: a transaction that fails for a transient
reason (SQLite busy or locked, a PostgreSQL serialization failure or deadlock, a dropped
connection) is run again, a few times with a growing pause; what still fails raises, so the
caller never acknowledges a write that did not commit. On SQLite the writes of one process take
turns on an asyncio lock: SQLite has one write lock per file, and a transaction holds it across
several round trips through the event loop (aiosqlite runs each statement on a thread of its
own), so under load the writers of one process used to queue in SQLite's busy handler and some
gave up after ``busy_timeout`` ("database is locked"). Writers of other processes on the same
file (two ingress replicas) still meet in the busy handler: ``busy_timeout`` and the retries
cover them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    Select,
    String,
    Text,
    delete,
    event,
    exists,
    func,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, aliased, mapped_column

from serve_app.store.base import (
    BackgroundRun,
    ItemPage,
    ResponseStore,
    RunEnding,
    StoredConversation,
    StoredResponse,
    cut_page,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A write that fails for a transient reason is tried this many times in all, pausing between
# tries for a random time up to a bound that doubles from the first to the last (full jitter:
# writers that collided do not collide again in step). On SQLite each try also waits up to
# ``busy_timeout`` (5 s) for the write lock, so a write gives up after about half a minute.
WRITE_ATTEMPTS = 6
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
# SQLite's "database is busy" and "a table is locked" (extended codes keep these low bits).
_SQLITE_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_SQLITE_BUSY_MESSAGES = ("database is locked", "database is busy", "database table is locked")
# PostgreSQL: serialization_failure, deadlock_detected; the server going away (class 57P:
# admin_shutdown, crash_shutdown, cannot_connect_now) and connection exceptions (class 08).
_PG_TRANSIENT_STATES = ("40001", "40P01", "57P01", "57P02", "57P03")


def transient(error: BaseException) -> bool:
    """Whether a failed transaction may succeed if run again: nothing of it was committed and
    the cause passes (contention, a connection lost). Constraint violations and bugs are not."""
    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    cause = error.orig
    if isinstance(cause, sqlite3.OperationalError):
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _SQLITE_BUSY_CODES:
            return True
        return str(cause).lower().startswith(_SQLITE_BUSY_MESSAGES)
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return isinstance(state, str) and (state in _PG_TRANSIENT_STATES or state.startswith("08"))


def backoff_s(attempt: int) -> float:
    """The pause after the ``attempt``-th failed try (1-based)."""
    return random.uniform(0, min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (attempt - 1)))


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


class RunRow(_Base):
    """The lease of a background response's run (see `BackgroundRun`). A table of its own,
    keyed by the response, so stores made before leases existed gain it with ``create_all``."""

    __tablename__ = "background_runs"
    __table_args__ = (Index("ix_background_runs_ended_expiry", "ended", "lease_expires_at"),)

    response_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    runner: Mapped[str] = mapped_column(String(128))
    lease_expires_at: Mapped[float] = mapped_column(Float)
    ended: Mapped[bool] = mapped_column(Boolean, default=False)


class ConversationRow(_Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    metadata_json: Mapped[str] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(64))


class ConversationItemRow(_Base):
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
        self._writes: async_sessionmaker | None = None
        # SQLite only: this process's writers take turns here, not in SQLite's busy handler.
        self._write_turns: asyncio.Lock | None = None

    async def start(self) -> None:
        url = make_url(self.url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            _private_sqlite_file(Path(url.database).expanduser())
        # A connection to an SQLite file does not go stale: no ping (a round trip per write).
        self._engine = create_async_engine(url, pool_pre_ping=url.get_backend_name() != "sqlite")
        if url.get_backend_name() == "sqlite":
            event.listen(self._engine.sync_engine, "connect", _sqlite_pragmas)
            event.listen(self._engine.sync_engine, "begin", _sqlite_begin)
            self._write_turns = asyncio.Lock()
        writer = self._engine.execution_options(**{_WRITES: True})
        self._sessions = async_sessionmaker(self._engine, expire_on_commit=False)
        self._writes = async_sessionmaker(writer, expire_on_commit=False)

        async def create_schema(session: AsyncSession) -> None:
            connection = await session.connection()
            await connection.run_sync(_Base.metadata.create_all)
            await _migrate(connection)

        # Two replicas starting on one SQLite file create the schema at the same moment.
        await self._transact(create_schema)
        logger.info("response store at %s", url.render_as_string(hide_password=True))

    async def put(self, stored: StoredResponse) -> None:
        async def write(session: AsyncSession) -> None:
            await _put_response(session, stored)

        await self._transact(write)

    async def save_turn(
        self,
        stored: StoredResponse | None,
        conversation_id: str | None,
        items: list[dict[str, Any]],
    ) -> None:
        async def write(session: AsyncSession) -> None:
            if stored is not None:
                await _put_response(session, stored)
            if conversation_id is not None:
                await _append_items(session, conversation_id, items)

        await self._transact(write)

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
        async def write(session: AsyncSession) -> bool:
            result = await session.execute(delete(ResponseRow).where(ResponseRow.id == response_id))
            await session.execute(delete(EventRow).where(EventRow.response_id == response_id))
            await session.execute(delete(ItemRow).where(ItemRow.response_id == response_id))
            await session.execute(delete(RunRow).where(RunRow.response_id == response_id))
            return result.rowcount > 0

        return await self._transact(write)

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

        async def write(session: AsyncSession) -> None:
            # New rows each try: a session that failed must not take the last try's objects.
            session.add_all(
                EventRow(response_id=response_id, sequence_number=number, event_json=data)
                for number, data in events
            )

        await self._transact(write)

    async def events_after(self, response_id: str, after: int) -> list[tuple[int, str]]:
        query = (
            select(EventRow.sequence_number, EventRow.event_json)
            .where(EventRow.response_id == response_id, EventRow.sequence_number > after)
            .order_by(EventRow.sequence_number)
        )
        async with self._session() as session:
            return [(number, data) for number, data in (await session.execute(query)).all()]

    async def request_cancel(self, response_id: str) -> None:
        async def write(session: AsyncSession) -> None:
            await session.execute(
                update(ResponseRow)
                .where(ResponseRow.id == response_id)
                .values(cancel_requested=True)
            )

        await self._transact(write)

    async def cancel_requested(self, response_id: str) -> bool:
        async with self._session() as session:
            row = await session.get(ResponseRow, response_id)
        return bool(row and row.cancel_requested)

    async def claim_run(self, response_id: str, runner: str, lease_s: float) -> None:
        async def write(session: AsyncSession) -> None:
            row = RunRow(
                response_id=response_id,
                runner=runner,
                lease_expires_at=time.time() + lease_s,
                ended=False,
            )
            await session.merge(row)

        await self._transact(write)

    async def renew_run(self, response_id: str, runner: str, lease_s: float) -> bool:
        async def write(session: AsyncSession) -> bool:
            result = await session.execute(
                update(RunRow)
                .where(
                    RunRow.response_id == response_id,
                    RunRow.runner == runner,
                    RunRow.ended.is_(False),
                )
                .values(lease_expires_at=time.time() + lease_s)
            )
            return result.rowcount == 1

        return await self._transact(write)

    async def finish_run(self, response_id: str, runner: str) -> None:
        async def write(session: AsyncSession) -> None:
            await session.execute(
                update(RunRow)
                .where(RunRow.response_id == response_id, RunRow.runner == runner)
                .values(ended=True)
            )

        await self._transact(write)

    async def get_run(self, response_id: str) -> BackgroundRun | None:
        async with self._session() as session:
            row = await session.get(RunRow, response_id)
        if row is None:
            return None
        return BackgroundRun(row.response_id, row.runner, row.lease_expires_at, row.ended)

    async def lapsed_runs(self) -> list[str]:
        query = select(RunRow.response_id).where(
            RunRow.ended.is_(False), RunRow.lease_expires_at < time.time()
        )
        async with self._session() as session:
            return list((await session.scalars(query)).all())

    async def end_run(
        self, response_id: str, ending: RunEnding, *, only_if_lapsed: bool = True
    ) -> bool:
        async def write(session: AsyncSession) -> bool:
            row = await session.get(ResponseRow, response_id)
            if row is None:
                return False
            if not await self._take_run(session, response_id, only_if_lapsed):
                return False
            response = json.loads(row.response_json)
            if response.get("status") not in ("queued", "in_progress"):
                return False  # its runner finished it after all; the run is marked ended
            done_items, last = await _persisted_ending_inputs(session, response_id)
            final, events = ending(response, done_items, last)
            row.response_json = json.dumps(final)
            session.add_all(
                EventRow(response_id=response_id, sequence_number=number, event_json=data)
                for number, data in events
            )
            output = [item for item in final.get("output") or [] if isinstance(item, dict)]
            session.add_all(_item_rows(output, row.owner, response_id=response_id))
            return True

        try:
            return await self._transact(write)
        except IntegrityError:
            return False  # another replica recorded the run of an old response first

    @staticmethod
    async def _take_run(session: AsyncSession, response_id: str, only_if_lapsed: bool) -> bool:
        """The compare-and-set: mark the run ended if it is not, and (``only_if_lapsed``) its
        lease lapsed. PostgreSQL locks the row for the update, and a second taker re-reads it
        once the first commits, finding it ended; SQLite's writers take turns."""
        condition = [RunRow.response_id == response_id, RunRow.ended.is_(False)]
        if only_if_lapsed:
            condition.append(RunRow.lease_expires_at < time.time())
        result = await session.execute(update(RunRow).where(*condition).values(ended=True))
        if result.rowcount == 1:
            return True
        if await session.get(RunRow, response_id) is not None:
            return False  # held by a live runner, or ended already
        # No run recorded: a background response from before leases. Recording it ended is
        # the compare-and-set here (a second recorder hits the primary key).
        session.add(RunRow(response_id=response_id, runner="", lease_expires_at=0, ended=True))
        await session.flush()
        return True

    async def put_conversation(
        self, conversation: StoredConversation, items: list[dict[str, Any]] | None = None
    ) -> None:
        async def write(session: AsyncSession) -> None:
            row = ConversationRow(
                id=conversation.id,
                created_at=conversation.created_at,
                metadata_json=json.dumps(conversation.metadata),
                owner=conversation.owner,
            )
            await session.merge(row)
            if items:
                await session.flush()  # the row is there for the append to find
                await _append_items(session, conversation.id, items)

        await self._transact(write)

    async def get_conversation(self, conversation_id: str) -> StoredConversation | None:
        async with self._session() as session:
            row = await session.get(ConversationRow, conversation_id)
        if row is None:
            return None
        return StoredConversation(
            row.id, row.created_at, json.loads(row.metadata_json), owner=row.owner
        )

    async def delete_conversation(self, conversation_id: str) -> bool:
        async def write(session: AsyncSession) -> bool:
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

        return await self._transact(write)

    async def append_items(self, conversation_id: str, items: list[dict]) -> None:
        if not items:
            return

        async def write(session: AsyncSession) -> None:
            await _append_items(session, conversation_id, items)

        await self._transact(write)

    async def conversation_items(self, conversation_id: str) -> list[dict]:
        query = (
            select(ConversationItemRow.item_json)
            .where(ConversationItemRow.conversation_id == conversation_id)
            .order_by(ConversationItemRow.position)
        )
        async with self._session() as session:
            return [json.loads(data) for data in (await session.scalars(query)).all()]

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        async def write(session: AsyncSession) -> bool:
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

        return await self._transact(write)

    async def conversation_page(
        self,
        conversation_id: str,
        *,
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
    ) -> ItemPage | None:
        descending = order == "desc"
        row = ConversationItemRow
        async with self._session() as session:
            start = None
            if after is not None:  # the first item with that id in listing order (cut_page)
                first = func.max(row.position) if descending else func.min(row.position)
                start = await session.scalar(
                    select(first).where(
                        row.conversation_id == conversation_id, row.item_id == after
                    )
                )
                if start is None:
                    return None
            entries: list[tuple[dict[str, Any], bool]] = []
            batch = limit + 1  # one more than the page: whether there is more
            while True:
                query = _page_query(conversation_id, start, descending, batch)
                rows = (await session.execute(query)).all()
                entries += [
                    (json.loads(data), bool(resolves_here)) for _, data, resolves_here in rows
                ]
                found = cut_page(entries, limit, complete=len(rows) < batch)
                if found is not None:
                    return found
                start = rows[-1][0]  # a run of repeated ids: the page goes on past the limit
                batch *= 2

    async def ids(self) -> list[str]:
        async with self._session() as session:
            return list((await session.scalars(select(ResponseRow.id))).all())

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()

    def _session(self) -> AsyncSession:
        """A session for reads (on SQLite: a deferred transaction, a snapshot)."""
        if self._sessions is None:
            raise RuntimeError("the response store is not started")
        return self._sessions()

    def _write(self) -> AsyncSession:
        """A session for a write transaction (on SQLite: BEGIN IMMEDIATE)."""
        if self._writes is None:
            raise RuntimeError("the response store is not started")
        return self._writes()

    async def _transact(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``work`` in a write transaction and commit it; run it again in a new one while it
        fails for a transient reason (`transient`), up to ``WRITE_ATTEMPTS`` tries, then raise.
        ``work`` makes its rows anew each try (a failed session's objects are discarded).

        One failure is not retried: a connection lost during COMMIT, when the transaction may
        have committed after all. It raises, and the caller reports a failure for a write that
        may be stored: never the other way round."""
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            committing = False
            try:
                async with self._write_turn(), self._write() as session, session.begin():
                    result = await work(session)
                    committing = True
                return result
            except DBAPIError as error:
                retry = transient(error) and not (committing and error.connection_invalidated)
                if not retry or attempt == WRITE_ATTEMPTS:
                    raise
                pause = backoff_s(attempt)
                logger.warning(
                    "response store: write failed (%s), try %d of %d in %.2fs",
                    error.orig,
                    attempt + 1,
                    WRITE_ATTEMPTS,
                    pause,
                )
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _write_turn(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """This process's turn to write: the asyncio lock on SQLite, nothing on PostgreSQL
        (whose writers lock only the rows they touch)."""
        return self._write_turns if self._write_turns is not None else contextlib.nullcontext()


async def _put_response(session: AsyncSession, stored: StoredResponse) -> None:
    """Insert or replace a response and its items' index, in the session's write transaction."""
    row = ResponseRow(
        id=stored.id,
        previous_response_id=stored.previous_response_id,
        created_at=int(stored.response.get("created_at") or time.time()),
        response_json=json.dumps(stored.response),
        input_items_json=json.dumps(stored.input_items),
        owner=stored.owner,
    )
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


async def _append_items(
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
    session.add_all(_item_rows(items, conversation.owner, conversation_id=conversation_id))


async def _persisted_ending_inputs(
    session: AsyncSession, response_id: str
) -> tuple[list[str], int]:
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


def _page_query(conversation_id: str, start: int | None, descending: bool, limit: int) -> Select:
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


async def _migrate(connection) -> None:
    """Bring a store made by an older version up to date (``create_all`` makes missing tables
    only): conversation item ids were VARCHAR(64), too short for clients' ids."""
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


# An execution option of the engine that write sessions use.
_WRITES = "serve_app_writes"


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at each commit in WAL mode
    cursor.execute("PRAGMA busy_timeout=5000")  # writers from other replicas wait, not fail
    cursor.close()
    # SQLAlchemy emits BEGIN (_sqlite_begin), not the driver.
    connection.isolation_level = None


def _sqlite_begin(connection) -> None:
    """SQLAlchemy, not the sqlite3 module, begins each transaction: the module starts one only
    at the first INSERT/UPDATE/DELETE, so a read before it was outside the transaction. A
    writing transaction begins IMMEDIATE: it takes SQLite's one write lock at once, waiting for
    it (``busy_timeout``) rather than failing later when a read snapshot turns out stale. Reads
    begin DEFERRED and never wait."""
    writes = connection.get_execution_options().get(_WRITES, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")
