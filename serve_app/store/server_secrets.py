"""Secrets the server makes for itself and every ingress replica shares: one row per name (the
reasoning key: serve_app/serving/reasoning_keys.py). A table of its own, so a store made by an
older version gains it with ``create_all``.

The first value written under a name is the one every replica keeps: a write never replaces a
row. Replicas starting at once each propose a value, and the row's primary key lets one in; the
others' inserts do nothing (``ON CONFLICT DO NOTHING``: on PostgreSQL an insert that meets
another transaction's uncommitted row waits for its commit, then does nothing; SQLite's writers
take turns, ``BEGIN IMMEDIATE``), and each then reads back the one that won.
"""

from __future__ import annotations

import time

from sqlalchemy import BigInteger, Insert, String, Text, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from serve_app.store.tables import Base


class ServerSecretRow(Base):
    __tablename__ = "server_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[int] = mapped_column(BigInteger)


async def read_secret(session: AsyncSession, name: str) -> str | None:
    return await session.scalar(select(ServerSecretRow.value).where(ServerSecretRow.name == name))


async def propose_secret(session: AsyncSession, name: str, proposal: str) -> str:
    """Store ``proposal`` under ``name`` unless a value is stored there already, and return the
    stored value (``proposal``, or the one that was there first), in the session's write
    transaction."""
    dialect = (await session.connection()).dialect.name
    await session.execute(_insert_if_absent(dialect, name, proposal))
    stored = await read_secret(session, name)
    if stored is None:  # only if the row was deleted between the two statements
        raise RuntimeError(f"the server secret {name!r} vanished while it was being stored")
    return stored


def _insert_if_absent(dialect: str, name: str, value: str) -> Insert:
    if dialect not in ("postgresql", "sqlite"):  # the store runs on these two only
        raise RuntimeError(f"server secrets need SQLite or PostgreSQL, not {dialect}")
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    row = {"name": name, "value": value, "created_at": int(time.time())}
    return insert(ServerSecretRow).values(**row).on_conflict_do_nothing(index_elements=["name"])
