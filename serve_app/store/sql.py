"""The response store on SQLAlchemy 2 async: SQLite (embedded default) or PostgreSQL.

SQLite runs in WAL mode so readers never block the writer and a crash loses no committed
response; PostgreSQL lets many ingress replicas share one store. Each response is one row
written in one transaction, together with the index of its items (``items``), which item
references are resolved through. Every write is one transaction that sees what it reads
(on SQLite: `sqlite.sqlite_begin`).

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
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlalchemy import (
    delete,
    event,
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

from serve_app.config import StoreConfig
from serve_app.store import issued_items, runs, tool_claims
from serve_app.store.base import (
    BackgroundRun,
    IssuedItem,
    ItemPage,
    PromptRecord,
    ResponseStore,
    RunEnding,
    StoredConversation,
    StoredResponse,
    cut_page,
)
from serve_app.store.expiry import Expiry, chain_query, expired_query
from serve_app.store.references import AsInput, release, stored_responses, unchanged, visible
from serve_app.store.retry import WRITE_ATTEMPTS, backoff_s, transient
from serve_app.store.server_secrets import propose_secret, read_secret
from serve_app.store.sql_tools import ToolLedger
from serve_app.store.sqlite import WRITES, private_sqlite_file, sqlite_begin, sqlite_pragmas
from serve_app.store.tables import (
    Base,
    ConversationItemRow,
    ConversationRow,
    EventRow,
    ItemRow,
    ResponseRow,
    RunRow,
    item_key,
    migrate,
    page_query,
    take_schema_turn,
)
from serve_app.store.writes import (
    append_items_at_end,
    delete_responses,
    put_response,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SqlResponseStore(ToolLedger, ResponseStore):
    def __init__(
        self,
        url: str,
        pool: StoreConfig | None = None,
        *,
        retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
        as_input: AsInput = unchanged,
    ) -> None:
        """``pool``: the connection pool's sizes (`StoreConfig`'s; its ``url`` is not read).
        ``retention_s``: a response older than this is expired: found by no read, deleted by
        `sweep_expired` (None: kept forever; ``clock``: epoch seconds). ``as_input``: a stored
        item as an input stores it (serve_app/store/references.py)."""
        self.url = url
        self._pool = pool or StoreConfig(url=url)
        self._expiry = Expiry(retention_s, clock)
        self._as_input = as_input
        self._engine: AsyncEngine | None = None
        self._sessions: async_sessionmaker | None = None
        self._writes: async_sessionmaker | None = None
        # SQLite only: this process's writers take turns here, not in SQLite's busy handler.
        self._write_turns: asyncio.Lock | None = None

    async def start(self) -> None:
        url = make_url(self.url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            private_sqlite_file(Path(url.database).expanduser())
        # A connection to an SQLite file does not go stale: no ping (a round trip per write).
        self._engine = create_async_engine(
            url, pool_pre_ping=url.get_backend_name() != "sqlite", **self._pool_options(url)
        )
        if url.get_backend_name() == "sqlite":
            event.listen(self._engine.sync_engine, "connect", sqlite_pragmas)
            event.listen(self._engine.sync_engine, "begin", sqlite_begin)
            self._write_turns = asyncio.Lock()
        writer = self._engine.execution_options(**{WRITES: True})
        self._sessions = async_sessionmaker(self._engine, expire_on_commit=False)
        self._writes = async_sessionmaker(writer, expire_on_commit=False)

        async def create_schema(session: AsyncSession) -> None:
            connection = await session.connection()
            await take_schema_turn(connection)
            await connection.run_sync(Base.metadata.create_all)
            await migrate(connection)

        # Two replicas starting on one SQLite file create the schema at the same moment.
        await self._transact(create_schema)
        logger.info("response store at %s", url.render_as_string(hide_password=True))

    async def put(self, stored: StoredResponse) -> None:
        async def write(session: AsyncSession) -> None:
            await put_response(session, stored, self._expiry.cutoff(), self._as_input)

        await self._transact(write)

    async def save_turn(
        self,
        stored: StoredResponse | None,
        conversation_id: str | None,
        items: list[dict[str, Any]],
        issued: Sequence[IssuedItem] = (),
        owner: str | None = None,
    ) -> None:
        async def write(session: AsyncSession) -> None:
            if stored is not None:
                await put_response(session, stored, self._expiry.cutoff(), self._as_input)
            if conversation_id is not None:
                await append_items_at_end(session, conversation_id, items)
            await issued_items.issue(session, owner, issued)

        await self._transact(write)

    async def get(self, response_id: str) -> StoredResponse | None:
        alive = self._expiry.alive(ResponseRow)
        query = select(ResponseRow).where(ResponseRow.id == response_id, alive)
        async with self._session() as session:
            rows = (await session.scalars(query)).all()
            return (await stored_responses(session, rows, self._as_input) or [None])[0]

    async def prompt_record(self, response_id: str, owner: str | None) -> PromptRecord | None:
        """The fingerprint alone (a deferred column `get` never loads), the owner's only."""
        alive = self._expiry.alive(ResponseRow)
        query = select(ResponseRow.owner, ResponseRow.prompt_fingerprint).where(
            ResponseRow.id == response_id, alive
        )
        async with self._session() as session:
            row = (await session.execute(query)).first()
        if row is None or row.owner != owner:
            return None
        return PromptRecord(row.prompt_fingerprint)

    async def chain(self, response_id: str) -> list[StoredResponse] | None:
        """The chain in one query, whatever its length (`chain_query`). A link that is gone
        (deleted, expired) ends it, as `ResponseStore.chain` does: it starts after it."""
        async with self._session() as session:
            rows = (await session.scalars(chain_query(response_id, self._expiry))).all()
            return await stored_responses(session, rows, self._as_input) or None

    async def sweep_expired(self, batch: int) -> int:
        """Delete up to ``batch`` expired responses (`expired_query`: several sweepers at once
        take different ones) with what hangs off them, in one transaction; how many."""
        if (cutoff := self._expiry.cutoff()) is None:
            return 0

        async def write(session: AsyncSession) -> int:
            ids = list((await session.scalars(expired_query(cutoff, batch))).all())
            await delete_responses(session, ids)
            # Claims and issued items age with the responses that made them.
            await tool_claims.sweep(session, cutoff)
            await issued_items.sweep(session, cutoff)
            return len(ids)

        return await self._transact(write)

    async def delete(self, response_id: str) -> bool:
        async def write(session: AsyncSession) -> bool:
            return await delete_responses(session, [response_id]) > 0

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
                ItemRow.item_key.in_([item_key(item_id) for item_id in wanted]),
                ItemRow.owner.is_not_distinct_from(owner),
            )
            .order_by(ItemRow.row_id)
        )
        # An expired response's items are gone with it (unless a live response names them).
        query = query.where(visible(self._expiry.cutoff()))
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
        await self._transact(lambda session: runs.claim(session, response_id, runner, lease_s))

    async def renew_run(self, response_id: str, runner: str, lease_s: float) -> bool:
        return await self._transact(
            lambda session: runs.renew(session, response_id, runner, lease_s)
        )

    async def finish_run(self, response_id: str, runner: str) -> None:
        await self._transact(lambda session: runs.finish(session, response_id, runner))

    async def get_run(self, response_id: str) -> BackgroundRun | None:
        async with self._session() as session:
            row = await session.get(RunRow, response_id)
        if row is None:
            return None
        return BackgroundRun(row.response_id, row.runner, row.lease_expires_at, row.ended)

    async def lapsed_runs(self) -> list[str]:
        async with self._session() as session:
            return list((await session.scalars(runs.lapsed_query())).all())

    async def end_run(
        self, response_id: str, ending: RunEnding, *, only_if_lapsed: bool = True
    ) -> bool:
        try:
            return await self._transact(
                lambda session: runs.end(session, response_id, ending, only_if_lapsed)
            )
        except IntegrityError:
            return False  # another replica recorded the run of an old response first

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
                await append_items_at_end(session, conversation.id, items)

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
            await release(session, ItemRow.conversation_id == conversation_id)
            return result.rowcount > 0

        return await self._transact(write)

    async def append_items(self, conversation_id: str, items: list[dict]) -> None:
        if not items:
            return

        async def write(session: AsyncSession) -> None:
            await append_items_at_end(session, conversation_id, items)

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
            held = ItemRow.item_key == item_key(item_id)  # by the conversation, below
            await release(session, held & (ItemRow.conversation_id == conversation_id))
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
                query = page_query(conversation_id, start, descending, batch)
                rows = (await session.execute(query)).all()
                entries += [
                    (json.loads(data), bool(resolves_here)) for _, data, resolves_here in rows
                ]
                found = cut_page(entries, limit, complete=len(rows) < batch)
                if found is not None:
                    return found
                start = rows[-1][0]  # a run of repeated ids: the page goes on past the limit
                batch *= 2

    async def shared_secret(self, name: str, proposal: str | None) -> str | None:
        if proposal is None:
            async with self._session() as session:
                return await read_secret(session, name)

        async def write(session: AsyncSession) -> str:
            return await propose_secret(session, name, proposal)

        return await self._transact(write)

    async def ids(self) -> list[str]:
        async with self._session() as session:
            return list((await session.scalars(select(ResponseRow.id))).all())

    def _pool_options(self, url: Any) -> dict[str, Any]:
        """The pool's sizes, for a pool of connections: an in-memory SQLite database has one
        connection (SQLAlchemy's StaticPool), which takes none."""
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            return {}
        return {
            "pool_size": self._pool.pool_size,
            "max_overflow": self._pool.max_overflow,
            "pool_timeout": self._pool.pool_timeout_s,
        }

    async def ping(self) -> None:
        """One round trip to the database (readiness): raises when it cannot answer."""
        async with self._session() as session:
            await session.execute(text("SELECT 1"))

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
